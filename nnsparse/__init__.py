"""nnsparse: PyTorch modules, criteria and tools for sparse inputs and targets.

The sparse forms accepted everywhere (torch COO and CSR, lists of sparse
vectors, Lua ``(k, 2)`` pair tensors) are described in ``docs/naming.md``.
The rating-data tools live in :mod:`nnsparse.data`.
"""
from . import criteria, layers
from .convert import densify, from_pairs, sparsify, to_pairs
from .sort import ssort, ssort_by_index, stopk
from .builder import DynamicSparseTensor
from .criteria import *  # noqa: F401,F403  (the list is criteria.__all__)
from .layers import *  # noqa: F401,F403  (the list is layers.__all__)
from . import data, optim
from .values import ValuesMap, values_map
from ._forms import trust
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
    "DynamicSparseTensor",
    "values_map",
    "ValuesMap",
    "trust",
    "SparseParts",
    "sparse_parts",
] + layers.__all__ + criteria.__all__
