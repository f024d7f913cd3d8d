"""nnsparse: PyTorch modules, criteria and tools for sparse inputs and targets.

The sparse forms accepted everywhere (torch COO and CSR, lists of sparse
vectors, Lua ``(k, 2)`` pair tensors) are described in ``docs/naming.md``.
The rating-data tools live in :mod:`nnsparse.data`.
"""
from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import criteria, layers
from .convert import densify, from_pairs, sparsify, to_pairs
from .sort import SortResult, TopkResult, ssort, ssort_by_index, stopk
from .builder import DynamicSparseTensor
from .criteria import *  # noqa: F401,F403  (the list is criteria.__all__)
from .layers import *  # noqa: F401,F403  (the list is layers.__all__)
from . import data, optim
from . import distributed
from ._optim_split import SplitOptimizer, make_optimizer, sparse_grad_parameters
from .values import ValuesMap, normalize, values_map
from ._forms import SparseLike, trust
from .matmul import sparse_mm
from ._ops import SparseParts, sparse_parts

__version__ = "0.1.0"

__all__ = [
    "sparsify",
    "densify",
    "to_pairs",
    "from_pairs",
    "ssort",
    "ssort_by_index",
    "stopk",
    "SortResult",
    "TopkResult",
    "DynamicSparseTensor",
    "values_map",
    "ValuesMap",
    "normalize",
    "trust",
    "SparseLike",
    "make_optimizer",
    "SplitOptimizer",
    "sparse_grad_parameters",
    "sparse_mm",
    "SparseParts",
    "sparse_parts",
]
# (added apart: mypy reads a list literal as __all__, not a sum of lists)
__all__ += layers.__all__
__all__ += criteria.__all__

from . import models  # noqa: E402  (after the layers and criteria it builds on)

if not _TYPE_CHECKING:  # (a module __getattr__ would make mypy accept any nnsparse.<name>)
    def __getattr__(name: str) -> object:
        """Lua nnsparse's names (``nnsparse.Sparsifier``...): the error names nnsparse's."""
        from ._lua import PACKAGE_NAMES
        hint = PACKAGE_NAMES.get(name)
        if hint is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        raise AttributeError(f"module {__name__!r} has no Lua name {name!r}; in nnsparse use "
                             f"{hint}")

# Last, once every module class is defined: torch.load(weights_only=True) of nnsparse modules.
from ._serialization import register_safe_globals as _register_safe_globals  # noqa: E402
_register_safe_globals()
