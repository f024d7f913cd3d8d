"""The public API's bookkeeping: every ``__all__`` is honest, and every public name
has a docstring with a doctested example (the doctests themselves run in the
package's doctest collection, ``setup.cfg``'s ``--doctest-modules``)."""
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
