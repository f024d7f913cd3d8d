"""Lua nnsparse's (torch7 ``nn``'s) members, as PyTorch spells them.

A port of Lua code reaches for ``layer:backward(input, gradOutput)``,
``criterion:updateGradInput(input, target)`` or ``layer.gradWeight``; torch's
own ``AttributeError`` says only that the attribute does not exist.  The
modules and criteria of nnsparse name the PyTorch way instead, from these
tables (read only when normal attribute lookup has failed: no cost otherwise).
"""

from typing import Dict, List, NoReturn, Optional, Union

from torch import Tensor, nn

__all__: List[str] = []

_MODULE_AUTOGRAD = "autograd: out = layer(input), then out.backward(grad_output)"
_CRITERION_AUTOGRAD = ("autograd: loss = criterion(estimate, target), then loss.backward(); "
                       "the estimate's gradient (Lua's gradInput) is then estimate.grad, the "
                       "estimate requiring grad")

# torch7 nn.Module's members every nnsparse module lacks
MODULE_MEMBERS: Dict[str, str] = {
    "updateOutput": "forward(input), or layer(input)",
    "backward": _MODULE_AUTOGRAD,
    "updateGradInput": _MODULE_AUTOGRAD,
    "accGradParameters": _MODULE_AUTOGRAD,
    "accUpdateGradParameters": _MODULE_AUTOGRAD + ", then an optimiser's step()",
    "updateParameters": "a torch.optim optimiser's step()",
    "gradInput": "input.grad: give the input's values requires_grad=True",
    "output": "the value layer(input) returns (a module keeps no output)",
    "zeroGradParameters": "zero_grad()",
    "getParameters": "parameters(); a flat copy: torch.cat([p.reshape(-1) for p in "
                     "layer.parameters()])",
    "clone": "copy.deepcopy(layer)",
    "evaluate": "eval()",
}

# ... and those of the modules holding a weight and a bias (nn.Linear's)
WEIGHT_MEMBERS: Dict[str, str] = {
    **MODULE_MEMBERS,
    "gradWeight": "weight.grad (filled by backward, accumulated until zero_grad())",
    "gradBias": "bias.grad (filled by backward, accumulated until zero_grad())",
    "reset": "reset_parameters() (nn.Linear's initialisation, no stdv)",
}

# torch7 nn.Criterion's members
CRITERION_MEMBERS: Dict[str, str] = {
    "updateOutput": "forward(estimate, target), or criterion(estimate, target)",
    "backward": _CRITERION_AUTOGRAD,
    "updateGradInput": _CRITERION_AUTOGRAD,
    "gradInput": "estimate.grad, after loss.backward(): give the estimate requires_grad=True",
    "output": "the loss criterion(estimate, target) returns (a criterion keeps no output)",
    "clone": "copy.deepcopy(criterion)",
    "evaluate": "eval()",
}

# Lua nnsparse's package-level names (and Tensor methods) that nnsparse spells otherwise
PACKAGE_NAMES: Dict[str, str] = {
    "Sparsifier": "nnsparse.Sparsify(offset=offset) (a keyword: Sparsify's first argument is "
                  "elem, as in sparsify(x, elem, offset))",
    "ssortByIndex": "nnsparse.ssort_by_index(x, descending=False, inplace=False)",
    "sortDim": "nnsparse.ssort(x) (Lua's dim 2, by value) or nnsparse.ssort_by_index(x) "
               "(dim 1, by index)",
    "prepareInput": "nnsparse.prepare_input(criterion, x)",
    "NaN": 'float("nan") (or math.nan)',
    # the README's Densify and Batchifier examples build nnsparse.Linear(100, 20): a dense
    # nn.Linear behind nnsparse.Densify (nnsparse has no Linear of its own)
    "Linear": "torch.nn.Linear(in_features, out_features) behind nnsparse.Densify(in_features) "
              "for a sparse input, or nnsparse.SparseLinearBatch(in_features, out_features)",
}


def member_error(owner: object, name: str, hint: str) -> AttributeError:
    """The error for the Lua member ``name`` of ``owner`` (an instance, or a class read
    through :class:`LuaName`), naming ``hint``."""
    what = owner.__name__ if isinstance(owner, type) else type(owner).__name__
    return AttributeError(f"{what} has no Lua attribute {name!r}; in nnsparse (as in torch) "
                          f"use {hint}")


def setting_error(owner: object, name: str, ours: str, holder: str) -> AttributeError:
    """The error for assigning ``name``, a Lua field of ``owner`` that nnsparse calls
    ``ours`` (a setting of its constructor, an attribute of ``holder``'s instances): an
    attribute of the Lua name would change nothing."""
    return AttributeError(f"{type(owner).__name__} has no Lua attribute {name!r}; nnsparse "
                          f"calls it {ours}: pass {ours}=... to the constructor or set "
                          f"{holder}.{ours}")


class LuaMembers(nn.Module):
    """Base of nnsparse's modules: a Lua member in ``_LUA_MEMBERS`` read from one
    raises an ``AttributeError`` naming what PyTorch uses instead."""

    _LUA_MEMBERS: Dict[str, str] = MODULE_MEMBERS

    def __getattr__(self, name: str) -> Union[Tensor, nn.Module]:
        try:
            return super().__getattr__(name)
        except AttributeError:
            hint = type(self)._LUA_MEMBERS.get(name)
            if hint is None:
                raise
        raise member_error(self, name, hint)


class LuaName:
    """A class attribute standing for a Lua name that nnsparse spells otherwise
    (``DynamicSparseTensor.new``): reading it, from the class or an instance,
    raises an ``AttributeError`` naming the counterpart (``hasattr`` is False).
    No data descriptor: an instance (of a subclass with a ``__dict__``) may still
    assign an attribute of that name (:class:`LuaField` refuses it)."""

    def __init__(self, hint: str) -> None:
        self._hint = hint
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: object, owner: Optional[type] = None) -> NoReturn:
        raise member_error(owner if owner is not None else obj, self._name, self._hint)


class LuaField(LuaName):
    """A :class:`LuaName` for a setting Lua's constructor kept as a field
    (``Batchifier.outputSize``), which Lua code reads and assigns: reading it raises
    :func:`member_error`, assigning it :func:`setting_error` (a data descriptor: an
    instance never holds an attribute of that name, which would change nothing)."""

    def __init__(self, ours: str, holder: str) -> None:
        super().__init__(ours)
        self._holder = holder

    def __set__(self, obj: object, value: object) -> NoReturn:
        raise setting_error(obj, self._name, self._hint, self._holder)

    def __delete__(self, obj: object) -> NoReturn:  # (was a bare "AttributeError: __delete__")
        raise member_error(obj, self._name, self._hint)


class LuaCount(LuaName):
    """A :class:`LuaName` for a count Lua kept as a field (``DynamicSparseTensor.curSize``):
    reading it raises :func:`member_error`, assigning or deleting it an ``AttributeError``
    naming what reads the count and what changes it (a data descriptor: neither an
    instance of a subclass with a ``__dict__`` takes an attribute of that name, which would
    change nothing, nor does the class's slots' "attribute is read-only" answer instead)."""

    def __init__(self, hint: str, changed_by: str) -> None:
        super().__init__(hint)
        self._changed_by = changed_by

    def _refusal(self, obj: object, verb: str) -> AttributeError:
        return AttributeError(f"{type(obj).__name__} has no Lua attribute {self._name!r} to "
                              f"{verb}; nnsparse counts it as {self._hint}, which "
                              f"{self._changed_by} change")

    def __set__(self, obj: object, value: object) -> NoReturn:
        raise self._refusal(obj, "assign")

    def __delete__(self, obj: object) -> NoReturn:
        raise self._refusal(obj, "delete")
