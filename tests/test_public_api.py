"""The public API's bookkeeping: every ``__all__`` is honest, every public name
has a docstring with a doctested example (the doctests themselves run in the
package's doctest collection, ``setup.cfg``'s ``--doctest-modules``), and every
name a public module defines is either in its ``__all__`` or starts with ``_``."""
import ast
import importlib
import inspect
import pkgutil

import pytest

import nnsparse

PUBLIC_MODULES = sorted(
    info.name for info in pkgutil.walk_packages(nnsparse.__path__, "nnsparse.")
    if not any(part.startswith("_") for part in info.name.split(".")[1:])) + ["nnsparse"]
# Names with no example of their own, and why.
NO_EXAMPLE = {
    "SparseLike": "a typing alias",
    "DistributedDataParallel": "needs a process group; tests/test_distributed.py",
    "sparse_allgather_hook": "needs a process group; tests/test_distributed.py",
    "rank": "in is_distributed's example", "world_size": "in is_distributed's example",
    "is_main": "in is_distributed's example", "unwrap": "in wrap's example",
    "RatingModel": "abstract; AutoRec's, CFN's and KernelNet's examples fit one",
    "Recommendations": "RatingModel.recommend's example",
    "Trainer": "the loop of every model's fit (AutoRec's, CFN's, KernelNet's examples)",
    "TrainResult": "what Trainer.fit returns",
}


def _module(name):
    return importlib.import_module(name)


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_honest(name):
    module = _module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    names = list(module.__all__)
    assert len(names) == len(set(names)), f"{name}.__all__ repeats a name"
    assert [n for n in names if not hasattr(module, n)] == []
    assert [n for n in names if n.startswith("_")] == []


# package __init__s only re-export
MODULES_WITH_CODE = [name for name in PUBLIC_MODULES
                     if not _module(name).__file__.endswith("__init__.py")]


@pytest.mark.parametrize("name", MODULES_WITH_CODE)
def test_every_public_module_has_doctests(name):
    assert ">>>" in inspect.getsource(_module(name)), f"{name} has no doctest"


def _public_objects():
    seen = {}
    for name in ["nnsparse", "nnsparse.optim", "nnsparse.data", "nnsparse.models",
                 "nnsparse.distributed"]:
        module = _module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and id(obj) not in seen:
                seen[id(obj)] = (f"{name}.{attr}", attr, obj)
    return sorted(seen.values(), key=lambda item: item[0])


@pytest.mark.parametrize("qualname, attr, obj", _public_objects(),
                         ids=[q for q, _, _ in _public_objects()])
def test_public_name_has_docstring_and_example(qualname, attr, obj):
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"{qualname} has no docstring"
    if attr not in NO_EXAMPLE:
        assert ">>>" in doc, f"{qualname} has no example"
    if inspect.isfunction(obj) and len(inspect.signature(obj).parameters) > 0:
        if attr not in NO_EXAMPLE or attr == "unwrap":
            assert "Args:" in doc, f"{qualname} documents no Args"


# Names a public module defines without a leading underscore, outside its __all__, and why.
NOT_IN_ALL = {
    "nnsparse.criteria.sdae.EntryMask": "pickled by this name in saved criteria and CFN models "
                                        "(torch.save); internal, not exported",
}


def _defined_names(module):
    """The names ``module``'s own source binds at its top level (def, class, assignment,
    also under ``if``/``try``), imports left out."""
    tree = ast.parse(inspect.getsource(module))
    names = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            todo += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_a_public_module_defines_no_public_looking_name_outside_all(name):
    # A helper of a public module starts with "_"; a name it means to offer is in __all__
    # (private modules, nnsparse._forms and the like, are internal by their own name)
    module = _module(name)
    stray = sorted(n for n in _defined_names(module) - set(module.__all__)
                   if not n.startswith("_") and f"{name}.{n}" not in NOT_IN_ALL)
    assert stray == [], (f"{name} defines {stray} outside its __all__: export them "
                         f"(with a docstring) or rename them with a leading underscore")


def test_not_in_all_is_current():
    for qualname in NOT_IN_ALL:
        module, name = qualname.rsplit(".", 1)
        assert name in _defined_names(_module(module)), qualname
        assert name not in _module(module).__all__, qualname


def test_sort_result_types_are_exported():
    # what ssort / ssort_by_index / stopk return, exported beside them
    for name in ("SortResult", "TopkResult"):
        assert name in nnsparse.__all__ and name in nnsparse.sort.__all__
    x = nnsparse.sparsify(__import__("torch").tensor([0., 2., 1.]))
    assert type(nnsparse.ssort(x)) is nnsparse.SortResult
    assert type(nnsparse.stopk(x, 1)) is nnsparse.TopkResult


def _private_imports(source):
    """What an example's ``source`` imports from nnsparse that is private: a module with a
    part starting with ``_`` (``nnsparse._optim_split``) or a ``_`` name from any of them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found += [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in found if m.split(".")[0] == "nnsparse"
            and any(part.startswith("_") for part in m.split(".")[1:])]


# Every module's doctests (the package's doctest collection runs all of them, also those of a
# private module that defines a public name: nnsparse._optim_split's make_optimizer).
ALL_MODULES = ["nnsparse"] + sorted(
    info.name for info in pkgutil.walk_packages(nnsparse.__path__, "nnsparse."))


@pytest.mark.parametrize("name", ALL_MODULES)
def test_doctest_examples_import_public_names_only(name):
    """A user copies a docstring's example: it must import no private module or name (the
    ``make_optimizer`` example imported ``nnsparse._optim_split``)."""
    import doctest
    private = [(test.name, ex.source.strip()) for test in doctest.DocTestFinder().find(
        _module(name)) for ex in test.examples if _private_imports(ex.source)]
    assert private == []
