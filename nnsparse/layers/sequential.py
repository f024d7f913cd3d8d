"""``PatternSequential``: ``nn.Sequential`` that hands a sparse pattern to the modules that take one."""
from __future__ import annotations

import inspect
from typing import Any, Dict, Iterable, Optional, Tuple, Type, cast

from torch import nn
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type

from .._forms import compile_boundary, is_int
from .._load import check_state_dict
from .._lua import LuaMembers

__all__ = ["PatternSequential"]


# how each class's forward takes the pattern, read once per class.  A plain dict, not
# functools.lru_cache: torch.compile of a PatternSequential traces the lookup (it warns
# on an lru_cache-wrapped function and traces the signature reading instead).  Keyed by
# id(cls), each value holding its class (checked with `is`; held, so its id is not
# reused): a torch sparse input makes dynamo run the container's forward eagerly and
# compile _takes_pattern as a frame of its own, and keyed by the class, that frame's
# `_PATTERN_KINDS.get(cls)` was guarded on the dict's first key only, never on cls: every
# later class got the first class's kind (the SparseOutputLinear of a compiled model fed
# COO tensors was called without its pattern, then "no module takes one" was raised).
_PATTERN_KINDS: Dict[int, Tuple[type, str]] = {}


def _takes_pattern(cls: Type[nn.Module]) -> str:
    """How ``cls.forward`` takes a parameter named ``pattern`` (read once per class):
    ``"keyword"``, ``"positional"`` (positional-only, right after the input: it
    cannot be passed as ``pattern=``), or ``""`` (not at all)."""
    known = _PATTERN_KINDS.get(id(cls))
    if known is not None and known[0] is cls:
        return known[1]
    how = _read_pattern_kind(cls)
    _PATTERN_KINDS[id(cls)] = (cls, how)
    return how


def _read_pattern_kind(cls: Type[nn.Module]) -> str:
    try:
        parameters = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # a forward without a readable signature
        return ""
    parameter = parameters.get("pattern")
    if parameter is None:
        return ""
    if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
        return "keyword"
    if parameter.kind == parameter.POSITIONAL_ONLY and list(parameters).index("pattern") == 2:
        return "positional"  # forward(self, input, pattern, /)
    return ""


def _forward_class(module: nn.Module) -> Type[nn.Module]:
    """The class whose ``forward`` a call of ``module`` runs: ``torch.compile(m)`` returns
    a wrapper (dynamo's ``OptimizedModule``, holding ``m`` as its submodule ``_orig_mod``)
    whose ``forward(*args, **kwargs)`` is the compiled call of ``m`` and passes a
    ``pattern=`` keyword on, so what ``m``'s class takes is what the wrapper takes.
    ``m.compile()`` compiles in place and keeps ``m``'s class."""
    while True:
        inner = module._modules.get("_orig_mod")
        if inner is None or _takes_pattern(type(module)):
            return type(module)
        module = inner


def _check_item(module: Any, where: str = "") -> None:
    """``TypeError`` unless ``module`` is an ``nn.Module`` (``where``: which item, for the
    message)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"PatternSequential takes nn.Module items, got "
                        f"{type(module).__name__} {module!r}{where}")


class PatternSequential(LuaMembers, nn.Sequential):
    r"""``nn.Sequential`` whose ``forward(input, pattern)`` passes ``pattern`` on.

    Each module is called as ``module(x)``, except those whose ``forward``
    has a ``pattern`` parameter (:class:`SparseOutputLinear`, a nested
    ``PatternSequential``, a user module with ``forward(self, x, pattern=None)``),
    which are called as ``module(x, pattern=pattern)`` (``module(x, pattern)``
    for a positional-only ``forward(self, x, pattern=None, /)``).  So a sparse
    autoencoder is one container::

        model = PatternSequential(SparseLinearBatch(n, h), nn.Tanh(),
                                  SparseOutputLinear(h, n), ValuesMap(torch.tanh))
        out = model(x, x)   # training: outputs at x's entries only
        full = model(x)     # inference: the dense (rows, n) output

    Indexing, slicing, ``append``, parameter names and ``state_dict`` keys are
    ``nn.Sequential``'s, so a state dict loads into either container.

    Args:
        *args: modules, or one ``OrderedDict`` of named modules, as ``nn.Sequential``.

    Shape:
        - input: what the first module takes.
        - pattern: a sparse ``(rows, out_features)`` pattern in any accepted
          form, or ``None`` (then this is ``nn.Sequential``).
        - output: what the last module returns.

    Raises:
        ValueError: a ``pattern`` that no module takes (it would be dropped).

    Example::

        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> model = nnsparse.PatternSequential(
        ...     nnsparse.SparseLinearBatch(4, 3), torch.nn.Tanh(),
        ...     nnsparse.SparseOutputLinear(3, 4), nnsparse.ValuesMap(torch.tanh))
        >>> x = torch.tensor([[1., 0., 0., 2.], [0., 3., 0., 0.]]).to_sparse()
        >>> out = model(x, x)
        >>> out.layout, out._nnz(), model(x).shape
        (torch.sparse_coo, 3, torch.Size([2, 4]))
    """

    def add_module(self, name: str, module: Optional[nn.Module]) -> None:
        # the constructor, append, extend, insert (item assignment: forward checks)
        _check_item(module, f" for item {name!r}")  # None too: forward would call it
        super().add_module(name, module)

    def extend(self, sequential: Iterable[nn.Module]) -> "PatternSequential":
        """``nn.Sequential.extend``, every item checked before the first is added."""
        items = list(sequential)
        for i, module in enumerate(items):
            _check_item(module, f" for item {str(len(self) + i)!r} (nothing was added)")
        return super().extend(items)

    def insert(self, index: int, module: nn.Module) -> "PatternSequential":
        _check_item(module)  # nn.Sequential's own check is an assert
        if not is_int(index):  # (not a numpy timedelta64: numbers.Integral takes one)
            raise TypeError(f"index must be an int, got {type(index).__name__} {index!r}")
        if not -len(self) <= index <= len(self):
            raise IndexError(f"index must be in [{-len(self)}, {len(self)}], got {index}")
        return super().insert(int(index), module)

    # nn.Sequential's + and * build a plain nn.Sequential, whose forward takes no
    # pattern: (a + b)(x, pattern) failed with "forward() takes 2 positional arguments".
    # The result keeps this class, as slicing does (+= and *= extend self already).
    def __add__(self, other: Any) -> "PatternSequential":
        return type(self)(*super().__add__(other))

    def __mul__(self, other: int) -> "PatternSequential":
        return type(self)(*super().__mul__(other))

    def __rmul__(self, other: int) -> "PatternSequential":
        return self.__mul__(other)

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> "_IncompatibleKeys":
        """``nn.Module.load_state_dict``, checked whole first: a refused load changes nothing
        (torch's copied the entries of the layers before the refused one).

        Raises:
            RuntimeError: torch's errors (keys, shapes, kinds; a ``SparseWeightLinear``'s
                state of another nnz), before anything is copied, ending in
                ``(nothing was loaded)``.
            ValueError: the loaded pattern of a ``SparseWeightLinear`` item is no valid
                CSR pattern; nothing is copied.
        """
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        return cast(_IncompatibleKeys,
                    super().load_state_dict(state_dict, strict=strict, assign=assign))

    @compile_boundary
    def forward(self, input: Any, pattern: Any = None) -> Any:
        if pattern is not None and not any(
                module is not None and _takes_pattern(_forward_class(module))
                for module in self._modules.values()):
            # it would be dropped: a dense output of every column where the caller asked
            # for the pattern's entries alone
            raise ValueError(f"pattern was given, but no module of this PatternSequential "
                             f"takes one (a SparseOutputLinear, or a module with "
                             f"forward(x, pattern=None)); its modules are "
                             f"{[type(m).__name__ for m in self._modules.values()]}")
        for name, module in self._modules.items():
            if module is None:  # set by item assignment, which add_module does not see
                raise TypeError(f"PatternSequential item {name!r} is None; give it an "
                                "nn.Module (nn.Identity() to skip it)")
            how = _takes_pattern(_forward_class(module)) if pattern is not None else ""
            if how == "keyword":
                input = module(input, pattern=pattern)
            elif how == "positional":
                input = module(input, pattern)
            else:
                input = module(input)
        return input
