"""nnsparse: PyTorch modules, criteria and tools for sparse inputs and targets.

The sparse forms accepted everywhere (torch COO and CSR, lists of sparse
vectors, Lua ``(k, 2)`` pair tensors) are described in ``docs/naming.md``.
"""
from .convert import densify, from_pairs, sparsify, to_pairs

__version__ = "0.1.0"

__all__ = [
    "sparsify",
    "densify",
    "to_pairs",
    "from_pairs",
]
