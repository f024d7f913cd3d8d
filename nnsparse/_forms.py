"""The one normalisation of every sparse form nnsparse accepts.

Every public function, layer and criterion calls :func:`as_sparse_batch` and
works on the :class:`SparseBatch` it returns; nothing else in the package
parses user input but for the two inputs a :class:`SparseBatch` does not
hold, which have their own checks: a batched 3-D operand of
:func:`nnsparse.sparse_mm` (:mod:`nnsparse.matmul`, into one flat pattern) and
the plain tensors of a :class:`~nnsparse.SparseParts` (:mod:`nnsparse._ops`).
The accepted forms (see ``docs/naming.md``):

* ``"coo"``: a torch sparse COO tensor, 1-D (a vector) or 2-D (a batch),
  coalesced or not (duplicates mean a sum, as torch defines);
* ``"csr"``: a 2-D torch sparse CSR tensor;
* ``"list"``: a Python list of 1-D sparse COO vectors, one per row (the Lua
  "table of sparse vectors"), rows may be empty;
* ``"pairs"``: a strided ``(k, 2)`` tensor of ``[index, value]`` rows with
  0-based indices (the Lua form of a sparse vector);
* ``"pair_list"``: a list of such pair tensors, one per row.

**Validate once** (``docs/sparse_batch.md``).  The first nnsparse call that receives
a torch sparse tensor checks it completely, with one host synchronisation,
and attaches the resulting index structure (int64 rows and columns, CSR row
pointers, the column-major order: built lazily, at most once) to the tensor,
in a table beside it (see ``_attach``; pickling the tensor writes it alone).
Later calls on the same tensor reuse it: no parse, no check.  The values are
always read from the tensor itself.  Tensors nnsparse builds carry their
structure from the start and are *trusted*; :func:`trust` marks a user's
tensor the same way without checking it.

The batch keeps the caller's device and dtype and keeps the autograd link to
the caller's values wherever torch allows it.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import numbers
import operator
import string
import sys
import types
import weakref
from dataclasses import dataclass, field, replace
from typing import (Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Protocol,
                    Sequence, Tuple, Type, TypeVar, Union, cast, overload)

import numpy as np
import torch
from torch import Tensor

from . import _index
# (assigned, not imported `as`: mypy would not re-export them to the other modules)
_sparse_coo = _index.coo_tensor
_sparse_csr = _index.csr_tensor

__all__ = ["SparseBatch", "SparseLike", "as_sparse_batch", "is_sparse_form", "is_pair_list",
           "check_index_range", "resolve_size", "trust", "as_int", "as_count", "as_flag",
           "check_int64", "int64_message", "check_numel", "as_device", "holds_exactly",
           "KERNEL_DTYPES", "check_kernel_dtype", "refuse_meta", "refuse_meta_device",
           "no_rows", "empty_batch", "EMPTY_ROWS_TENSOR", "EMPTY_ROWS_WAY_ROUND",
           "int_of_0d", "int_kind", "int_dtype", "is_int", "lua_pairs_hint", "check_coo_indices",
           "scipy_sparse_hint", "compile_boundary", "sparse_output_boundary",
           "EXACT_INDEX", "exact_index", "NO_INDEX", "no_index_error"]

#: Any sparse form nnsparse accepts: a torch sparse COO/CSR tensor, a ``(k, 2)``
#: pair tensor, or a list of sparse vectors or pair tensors (one per row).
SparseLike = Union[Tensor, Sequence[Tensor]]

# The name under which a torch tensor's checked structure is kept (see _attach).
_ATTR = "_nnsparse_structure"

# The structures attached to tensors: (id(tensor), name) -> (a weak reference to the
# tensor, the structure).  Kept beside the tensors rather than in their __dict__,
# which pickling copies: torch.save of a tensor nnsparse had read then wrote
# nnsparse's classes into the file, which torch.load(weights_only=True), torch's
# default, refused ("Weights only load failed"), and the pattern's index tensors
# with them.  An entry goes when its tensor does.
_STRUCTURES: Dict[Tuple[int, str], Tuple["weakref.ref[Tensor]", Any]] = {}


def check_index_range(index: Tensor, bound: Optional[int], name: str) -> int:
    """Raise ``ValueError`` unless every entry of ``index`` is in ``[0, bound)``.

    Returns ``max(index) + 1`` (0 when ``index`` is empty), the smallest size
    that holds the data.  ``bound=None`` only checks for negative entries.
    One host synchronisation.
    """
    if index.layout != torch.strided:  # (torch's aminmax has no sparse kernel)
        raise TypeError(f"{name} must be a dense tensor of indices, got layout {index.layout}")
    refuse_meta(index, name)
    if index.numel() == 0:
        return 0
    lo, hi = torch.stack(list(torch.aminmax(index))).tolist()
    if lo < 0:
        raise ValueError(f"{name} must be non-negative, got min {lo}")
    if bound is not None and hi >= bound:
        raise ValueError(f"{name} must be in [0, {bound}), got max {hi}")
    if hi >= _INT64_MAX:  # the size that holds it, max + 1, is beyond int64 (torch's overflow)
        raise ValueError(f"{name} must be below 2**63 - 1 (the size max + 1 must fit int64), "
                         f"got max {hi}")
    return int(hi) + 1


def _pair_index(column: Tensor, name: str) -> Tensor:
    """The int64 index column of a pair tensor, checked to hold whole numbers."""
    if column.dtype == torch.bool or column.is_complex():
        raise TypeError(f"{name} indices must be real numbers, got dtype {column.dtype}")
    if column.dtype in NO_INDEX:
        raise no_index_error(column.dtype, f"{name} indices", "build the pairs as float64 or int64")
    if column.is_floating_point():
        column = column.detach()
        finite = torch.isfinite(column)
        if not bool(finite.all()):
            bad = column[~finite][0].item()
            raise ValueError(f"{name} indices must be finite integers, got {bad}")
        whole = column == column.floor()
        if not bool(whole.all()):
            bad = column[~whole][0].item()
            raise ValueError(f"{name} indices must be integers, got {bad}")
        # beyond 2 ** (mantissa bits + 1) a float no longer holds every integer: the
        # index the caller meant may already have been rounded to its neighbour
        exact = exact_index(column.dtype)
        if column.numel() and float(column.abs().max()) > exact:
            raise ValueError(f"{name} indices stored as {column.dtype} are exact only up to "
                             f"{int(exact)}, got {float(column.abs().max()):g}; build the pairs "
                             f"as float64 or int64")
    return column.to(torch.int64)


@dataclass(eq=False)
class _Cache:
    """Derived index structures of one pattern, built at most once each.

    Shared by every :class:`SparseBatch` with that pattern (same ``row`` and
    ``col``), whatever its values.
    """

    crow: Optional[Tensor] = None
    column_major: Optional[Tuple[Tensor, Tensor, Tensor, Tensor]] = None
    coo_indices: Optional[Tensor] = None  # a COO index tensor of exactly (row, col)
    col_index: Optional[Tensor] = None  # a CSR col tensor of exactly col (the caller's dtype)
    by_row: Optional[Tuple[Tensor, "SparseBatch"]] = None  # order, row-sorted pattern
    coalesced: Optional[Tuple[Tensor, "SparseBatch"]] = None  # inverse, coalesced pattern
    # blocks -> (order, crow_b) of _index.blocked_order
    blocked: Dict[int, Tuple[Tensor, Tensor]] = field(default_factory=dict)
    # width -> (perm, crow_t, row_t) of _index.column_major_all
    column_major_all: Dict[int, Tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)
    # read or attached under torch.inference_mode(): what was built since may be inference
    # tensors, which a backward cannot save (see _from_tensor)
    inference: bool = False

    def to(self, device: torch.device, non_blocking: bool = False) -> "_Cache":
        """``crow``, ``column_major`` and the index tensors moved to ``device``; the
        nested patterns and the ``blocked`` / ``column_major_all`` orders are dropped
        (built again where they are needed, with no host sync)."""
        def move(t: Any) -> Any:
            if t is None:
                return None
            if isinstance(t, tuple):
                return tuple(move(u) for u in t)
            return t.to(device, non_blocking=non_blocking)
        # (moved to its own device, an inference tensor stays one: the mark goes with it)
        return _Cache(move(self.crow), move(self.column_major), move(self.coo_indices),
                      move(self.col_index), inference=self.inference)


@dataclass
class SparseBatch:
    """A sparse batch in coordinate form: what every accepted form becomes.

    ``row``/``col`` are int64 ``(nnz,)`` tensors on the values' device;
    ``values`` is ``(nnz,)`` and carries the autograd link to the caller's
    values.  A vector is a batch of one row with ``is_vector=True``.
    ``row_sorted`` says the entries are grouped by row in increasing order
    (needed for CSR); ``coalesced`` says, in addition, that no (row, col) pair
    repeats and columns increase within a row.  ``trusted`` says nnsparse
    built or checked the indices (or the user vouched for them, :func:`trust`).

    Derived structures (:meth:`crow_indices`, :meth:`column_major_all`,
    :meth:`column_major`, :meth:`blocked_order`, the orders of
    :meth:`sorted_by_row` and :meth:`coalesce`) are built lazily,
    once, in a cache shared by the batches of one pattern: a copy made by
    :meth:`with_values` or :meth:`with_pattern_values` shares it, a
    ``dataclasses.replace`` gets a fresh one.
    """

    row: Tensor
    col: Tensor
    values: Tensor
    shape: Tuple[int, int]
    form: str
    is_vector: bool = False
    row_sorted: bool = False
    coalesced: bool = False
    trusted: bool = False
    cache: _Cache = field(default_factory=_Cache, init=False, repr=False, compare=False)

    # -- plain facts ---------------------------------------------------------
    @property
    def nnz(self) -> int:
        return self.col.shape[0]

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return self.shape[1]

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def row_counts(self) -> Tensor:
        """Number of specified entries of each row, int64 ``(rows,)`` (no host sync)."""
        if self.row_sorted:
            return self.crow_indices().diff()
        return _index.counts_of(self.row, self.rows)

    def crow_indices(self) -> Tensor:
        """CSR row pointers, int64 ``(rows + 1,)``; needs ``row_sorted``.  Cached."""
        if not self.row_sorted:
            raise RuntimeError("crow_indices needs a row-sorted batch; call sorted_by_row() first")
        if self.cache.crow is None:
            self.cache.crow = _index.crow_from_rows(self.row, self.rows)
        return self.cache.crow

    def column_major(self) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """The transposed structure restricted to the columns the batch touches.  Cached.

        Returns ``perm`` (the entries in column order, stable), ``cols`` (the
        distinct columns, increasing), ``crow_t`` (CSR pointers of the
        transposed pattern over ``cols``) and ``row_t`` (the rows of the
        entries in ``perm`` order), so ``S.T @ A`` restricted to ``cols`` is
        ``_csr_rows_mm(row_t, A, crow_t, values[perm])``.  Derived from
        :meth:`column_major_all` when that is cached, at any width (the
        narrowest: every entry's column lies below each, and the pointers past
        the batch's width are those of empty columns), else from the sort of
        the entries alone, O(nnz) whatever the width (one sort of the entries
        per pattern, whichever is asked first); ``cols`` has a data-dependent
        size: one host sync on CUDA.
        """
        if self.cache.column_major is None:
            _index.count("column_major")
            if self.cache.column_major_all:
                perm, crow_all, row_t = self.cache.column_major_all[
                    min(self.cache.column_major_all)]
                counts = crow_all.diff()
                cols = counts.nonzero().squeeze(1)
                counts = counts[cols]
            else:  # no (width + 1,) pointers: a sparse gradient of a huge table stays O(nnz)
                _index.count("column_sort")
                perm = _index.stable_order(self.col, self.width)
                cols, counts = torch.unique_consecutive(self.col.index_select(0, perm),
                                                        return_counts=True)
                row_t = self.row.index_select(0, perm)
            self.cache.column_major = (perm, cols, _index.crow_from_counts(counts), row_t)
        return self.cache.column_major

    def column_major_all(self, width: int) -> Tuple[Tensor, Tensor, Tensor]:
        """``(perm, crow_t, row_t)`` of ``_index.column_major_all`` over ``width`` columns
        (no host sync).  Cached."""
        if width not in self.cache.column_major_all:
            known = self.cache.column_major
            if known is not None and width >= self.width:  # its sort, not a second one
                _index.count("column_major_all")
                perm, cols, crow_t, row_t = known
                counts = crow_t.new_zeros(width).index_put_((cols,), crow_t.diff())
                self.cache.column_major_all[width] = (perm, _index.crow_from_counts(counts),
                                                      row_t)
            else:
                self.cache.column_major_all[width] = _index.column_major_all(self.row,
                                                                             self.col, width)
        return self.cache.column_major_all[width]

    def blocked_order(self, blocks: int) -> Tuple[Tensor, Tensor]:
        """``(order, crow_b)`` of ``_index.blocked_order`` for ``blocks`` column spans.  Cached."""
        if blocks not in self.cache.blocked:
            self.cache.blocked[blocks] = _index.blocked_order(self.row, self.col, self.rows,
                                                              self.width, blocks)
        return self.cache.blocked[blocks]

    def with_pattern_values(self, values: Tensor) -> "SparseBatch":
        """This batch with other ``values`` ``(nnz,)``, sharing the pattern's cache."""
        out = copy.copy(self)  # a shallow copy keeps the same _Cache object
        out.values = values
        return out

    # -- reorderings ----------------------------------------------------------
    def linear_index(self) -> Tensor:
        """``row * width + col``: one int64 key per entry, row-major."""
        return self.row * self.width + self.col

    def sorted_by_row(self) -> "SparseBatch":
        """The same entries grouped by row (stable; a no-op when already so)."""
        if self.row_sorted:
            return self
        if self.cache.by_row is None:
            _index.count("sort")
            order = _index.stable_order(self.row, self.rows)
            pattern = replace(self, row=self.row.index_select(0, order),
                              col=self.col.index_select(0, order),
                              values=self.values[:0], row_sorted=True)
            self.cache.by_row = (order, pattern)
        order, pattern = self.cache.by_row
        out = pattern.with_pattern_values(self.values.index_select(0, order))
        out.shape, out.form, out.trusted = self.shape, self.form, self.trusted
        return out

    def coalesce(self) -> "SparseBatch":
        """Duplicates summed, entries sorted row-major (differentiable in values)."""
        if self.coalesced:
            return self
        inverse, pattern = self._coalesced_pattern()
        values = self.values.new_zeros(pattern.nnz).index_add(0, inverse, self.values)
        out = pattern.with_pattern_values(values)
        out.shape, out.form, out.trusted = self.shape, self.form, self.trusted
        return out

    def _coalesced_pattern(self) -> Tuple[Tensor, "SparseBatch"]:
        """``(inverse, pattern)``: each entry's place in the coalesced pattern.  Cached."""
        if self.cache.coalesced is None:
            _index.count("coalesce")
            key = self.linear_index()
            unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
            pattern = replace(self, row=unique // self.width, col=unique % self.width,
                              values=self.values[:0], row_sorted=True, coalesced=True)
            self.cache.coalesced = (inverse, pattern)
        return self.cache.coalesced

    # -- conversions -----------------------------------------------------------
    def to_coo(self) -> Tensor:
        """A 2-D torch sparse COO tensor ``(rows, width)`` (1-D for a vector), trusted."""
        index = self.cache.coo_indices
        if index is None:
            index = self.col.unsqueeze(0) if self.is_vector else torch.stack([self.row, self.col])
            self.cache.coo_indices = index
        size = (self.width,) if self.is_vector else self.shape
        out = _sparse_coo(index, self.values, size, self.coalesced)
        return attach(out, self)

    def to_csr(self) -> Tensor:
        """A 2-D torch sparse CSR tensor ``(rows, width)``, duplicates summed, trusted.

        Inside a ``torch.func`` transform, where torch can hold no CSR tensor,
        the coalesced COO tensor of the same entries.
        """
        batch = self.coalesce()
        col = batch.cache.col_index if batch.cache.col_index is not None else batch.col
        try:
            out = _sparse_csr(batch.crow_indices(), col, batch.values, self.shape)
        except RuntimeError:  # "Sparse CSR tensors do not have strides" (functorch)
            if not _index.in_transform():
                raise
            return batch.to_coo()
        return attach(out, batch)

    def with_values(self, values: Tensor, keep: Optional[Tensor] = None) -> SparseLike:
        """Rebuild the caller's form with new ``values`` (``(nnz,)``).

        ``keep`` (bool ``(nnz,)``) drops the entries where it is False (a
        data-dependent size: a host sync on CUDA).  Without it the result
        shares this batch's index tensors and cached structures.  The result
        has the form, width and row count the batch was made from.
        """
        if keep is None:
            batch = self.with_pattern_values(values)
        else:
            batch = replace(self, row=self.row[keep], col=self.col[keep], values=values[keep])
        if self.form == "coo":
            return batch.to_coo()
        if self.form == "csr":
            return batch.to_csr()
        counts = batch.row_counts().tolist()
        batch = batch.sorted_by_row()
        if self.form == "list":
            return [_sparse_coo(c.unsqueeze(0), v, (self.width,), False)
                    for c, v in zip(batch.col.split(counts),  # type: ignore[no-untyped-call]
                                    batch.values.split(counts))]  # type: ignore[no-untyped-call]
        pairs = _as_pairs(batch)
        if self.form == "pairs":
            return pairs
        return list(pairs.split(counts))  # type: ignore[no-untyped-call]


#: :func:`_as_pairs`'s words for a dtype of :data:`NO_INDEX` (to_pairs' too).
_PAIRS_OF_X = "x's indices (cast to the values' dtype)"
_CONVERT_X = "convert the values to float64 or int64"


def _as_pairs(batch: SparseBatch) -> Tensor:
    """The ``(nnz, 2)`` pair tensor of a batch, indices cast to the values' dtype.

    Raises ``ValueError`` when an index cannot be stored exactly in that dtype
    (int8 cannot hold 200; float16 holds integers exactly up to 2048; bool none).
    """
    dtype = batch.dtype
    if dtype in NO_INDEX:  # whatever the entries: no index of this dtype is stored
        raise no_index_error(dtype, _PAIRS_OF_X, _CONVERT_X)
    if batch.nnz and batch.width > 0:
        top = batch.width - 1  # the largest index the batch may hold
        if dtype == torch.bool:
            limit = 1
        elif dtype.is_floating_point or dtype.is_complex:
            limit = int(exact_index(dtype))
        else:
            limit = torch.iinfo(dtype).max
        if top > limit:
            raise ValueError(
                f"x has width {batch.width}: its int64 indices (up to {top}) cannot be cast "
                f"exactly to the values' dtype {dtype} (largest exact index {limit}), so they "
                f"cannot be stored exactly as {dtype}; convert the values to float64 or int64")
    return torch.stack([batch.col.to(dtype), batch.values], dim=1)


def is_sparse_form(x: Any) -> bool:
    """True for a torch sparse tensor or a list/tuple (of sparse rows)."""
    if isinstance(x, Tensor):
        return x.layout != torch.strided
    return isinstance(x, (list, tuple))


def is_pair_list(x: Any) -> bool:
    """True for a non-empty list/tuple of strided tensors: Lua ``(k, 2)`` pair rows, whose
    width only the caller knows (their largest index + 1 is no width)."""
    return isinstance(x, (list, tuple)) and bool(x) and all(
        isinstance(r, Tensor) and r.layout == torch.strided for r in x)


# -- the structure a torch tensor carries ------------------------------------------


@dataclass(eq=False)
class _Attached:
    """What a torch sparse tensor carries once nnsparse has seen it."""

    key: Optional[Tuple[Any, ...]]  # None: not cached (see _key)
    pattern: SparseBatch  # values empty: they are read from the tensor each call
    recoalesce: bool  # an uncoalesced COO that requires grad: coalesce each call


def _version(t: Tensor) -> int:
    """``t._version``; -1 for an inference tensor (torch.inference_mode), which has no
    version counter: its in-place index changes go unseen (indices are not edited in place)."""
    return -1 if t.is_inference() else t._version


def _key(x: Tensor) -> Optional[Tuple[Any, ...]]:
    """What must not change for an attached structure to stay valid (free to read).

    ``None`` inside a ``torch.func`` transform, where a COO tensor's indices
    come back wrapped, with no data pointer to read, and a CSR tensor's cannot
    be read at all: the structure is then built and checked at each call,
    never attached nor looked up.  So nothing the transform computes (its
    tensors are wrapped, and die with it) enters a structure that outlives it.
    """
    if x.layout == torch.sparse_csr:
        try:
            crow, col = x.crow_indices(), x.col_indices()
        except RuntimeError:  # inside a transform (see nnsparse._index.csr_read)
            if not _index.in_transform():
                raise
            return None
        crow_ptr, col_ptr = _index.data_ptr(crow), _index.data_ptr(col)
        if crow_ptr is None or col_ptr is None:
            return None
        return (tuple(x.shape), x.device, crow_ptr, col_ptr, col.shape[0],
                _version(crow), _version(col))
    index = x._indices()
    ptr = _index.data_ptr(index)
    if ptr is None:
        return None
    # requires_grad: an uncoalesced COO that requires grad is coalesced each call
    return (tuple(x.shape), x.device, ptr, index.shape[1], _version(index),
            x.is_coalesced(), x.requires_grad)


class _Keyed(Protocol):
    """A structure cached on a tensor: the :func:`_key` of the tensor it was built from."""

    key: Optional[Tuple[Any, ...]]


_K = TypeVar("_K", bound=_Keyed)


def _attach(x: Tensor, found: _Keyed, attr: str = _ATTR) -> None:
    """Attach ``found`` to ``x`` under ``attr``, unless its key could not be read (then
    nothing is cached).  ``attr``: nnsparse's batch structure by default;
    ``nnsparse.matmul`` caches a 3-D tensor's flat pattern under its own name."""
    if found.key is None:
        return
    if isinstance(found, _Attached) and torch.is_inference_mode_enabled():
        found.pattern.cache.inference = True
    slot = (id(x), attr)

    def forget(ref: "weakref.ref[Tensor]") -> None:  # x is gone: so is its entry
        if _STRUCTURES.get(slot, (None,))[0] is ref:
            del _STRUCTURES[slot]
    _STRUCTURES[slot] = (weakref.ref(x, forget), found)


def attach(x: Tensor, batch: SparseBatch) -> Tensor:
    """Attach ``batch``'s pattern (trusted) to the tensor ``x`` nnsparse built from it.

    An uncoalesced COO ``x`` that requires grad (``from_pairs`` of values that
    require grad) is read through ``x.coalesce().values()`` (``x._values()``
    carries no gradient), as a user's tensor is: it gets the coalesced pattern.
    """
    form = "csr" if x.layout == torch.sparse_csr else "coo"
    recoalesce = form == "coo" and x.requires_grad and not x.is_coalesced()
    source = batch._coalesced_pattern()[1] if recoalesce else batch
    pattern = source.with_pattern_values(batch.values.detach()[:0])
    pattern.shape, pattern.is_vector = batch.shape, batch.is_vector
    pattern.trusted, pattern.form = True, form
    if form == "coo" and not recoalesce and not x.is_coalesced():
        pattern.coalesced = False
    _attach(x, _Attached(_key(x), pattern, recoalesce))
    return x


def _attached(x: Tensor) -> Optional[_Attached]:
    return _cached(x, _ATTR, _Attached)


def _cached(x: Tensor, attr: str, kind: Type[_K]) -> Optional[_K]:
    """The ``kind`` structure :func:`_attach` left on ``x`` under ``attr``, if ``x`` has
    not changed since (same :func:`_key`); else ``None``."""
    entry = _STRUCTURES.get((id(x), attr))
    # (the id of a dead tensor may be a new one's: the weak reference tells them apart)
    found = entry[1] if entry is not None and entry[0]() is x else None
    # (an attached key is never None: a key of None, inside a transform, matches none)
    if not isinstance(found, kind) or found.key != _key(x):
        return None
    return found


def _values_of(x: Tensor, found: _Attached) -> Tensor:
    """The tensor's current values, differentiable where torch allows it."""
    if x.layout == torch.sparse_csr:
        return _index.csr_values(x)
    if found.recoalesce:
        return x.coalesce().values()
    return x.values() if (x.requires_grad and x.is_coalesced()) else x._values()


def trust(x: Tensor) -> Tensor:
    """Mark a torch sparse tensor as valid: nnsparse will not check its indices.

    Like pytorch_sparse's ``trust_data``: for a hot loop over batches that
    are known to be valid (COO indices in range; CSR row pointers starting at
    0, non-decreasing, ending at nnz, columns in range and increasing within
    each row).  nnsparse then builds the tensor's index structure without
    reading the data back to the host.  An invalid trusted tensor gives wrong
    results, a kernel error or, for CSR row pointers beyond nnz, a crash of
    the process (torch's kernels read and write out of bounds): trust only
    tensors built valid.  Batches nnsparse makes (the collate function,
    :func:`~nnsparse.sparsify`, ``prepare_input``, layer outputs) are trusted
    already.  A copy of the tensor (``x.to('cuda')``, ``x.coalesce()``) is a
    new tensor, checked again at its first use unless trusted again.

    Args:
        x (Tensor): a sparse COO (1-D or 2-D) or CSR (2-D) tensor.

    Returns:
        ``x`` itself.

    Raises:
        TypeError: ``x`` is not a sparse COO or CSR tensor.

    Example::

        >>> x = nnsparse.trust(torch.tensor([[0., 1.], [2., 0.]]).to_sparse_csr())
        >>> nnsparse.densify(x)
        tensor([[0., 1.],
                [2., 0.]])
    """
    if not isinstance(x, Tensor) or x.layout not in (torch.sparse_coo, torch.sparse_csr):
        got = f"layout {x.layout}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a sparse COO or CSR tensor, got {got}")
    _structure(x, "x", check=False)
    return x


def no_rows(x: Any) -> bool:
    """Whether ``x`` is an empty list (or tuple) of rows: a batch of no rows that holds no
    width, dtype nor device of its own (:func:`as_sparse_batch` gives it float32 values
    on the CPU, and needs a ``width``)."""
    return isinstance(x, (list, tuple)) and not hasattr(x, "_fields") and len(x) == 0


def empty_batch(width: int, like: Tensor) -> Tensor:
    """A trusted empty ``(0, width)`` COO batch with ``like``'s dtype and device: what an
    empty list of rows stands for where the caller knows the width, dtype and device
    (a layer's weight, a criterion's estimate)."""
    index = torch.zeros(2, 0, dtype=torch.int64, device=like.device)
    return trust(_sparse_coo(index, like.new_zeros(0), (0, width), coalesced=True))


def _structure(x: Tensor, name: str, check: bool) -> _Attached:
    """Build (checking it unless ``check`` is False) and attach ``x``'s structure.

    An inference tensor used outside ``torch.inference_mode()`` gets its
    structure from a copy (once: it is attached), whose index tensors a
    layer's backward can save.
    """
    build = _csr_structure if x.layout == torch.sparse_csr else _coo_structure
    return _attach_built(x, lambda source: build(source, name, check))


def _attach_built(x: Tensor, build: Callable[[Tensor], _K], attr: str = _ATTR) -> _K:
    """``build(x)``, attached to ``x`` under ``attr`` (see :func:`_attach`).

    An inference tensor used outside ``torch.inference_mode()`` is built from
    a copy, whose index tensors a layer's backward can save; the structure is
    keyed by ``x`` itself.
    """
    source = _index.outside_inference(x)
    found = build(source)
    if source is not x:
        found.key = _key(x)
    _attach(x, found, attr)
    return found


def _coo_structure(x: Tensor, name: str, check: bool) -> _Attached:
    if x.dense_dim() != 0:
        raise NotImplementedError(
            f"{name}: hybrid sparse tensors are not supported, got dense_dim {x.dense_dim()}")
    if x.sparse_dim() not in (1, 2):
        raise ValueError(f"{name} must be a sparse vector or a 2-D sparse batch, "
                         f"got {x.sparse_dim()} dimensions")
    index = x._indices()
    if check:
        _index.count("validate")
        what = ["indices"] if x.sparse_dim() == 1 else ["row indices", "column indices"]
        check_coo_indices(index, x.shape, name, what, x.is_coalesced())
    recoalesce = x.requires_grad and not x.is_coalesced()
    source = x.coalesce() if recoalesce else x
    coalesced = source.is_coalesced()
    index = source._indices().to(torch.int64)
    values = source._values().detach()[:0]
    if x.sparse_dim() == 1:
        col = index[0]
        pattern = SparseBatch(torch.zeros_like(col), col, values, (1, x.shape[0]), "coo",
                              is_vector=True, row_sorted=True, coalesced=coalesced,
                              trusted=True)
    else:
        pattern = SparseBatch(index[0], index[1], values, (x.shape[0], x.shape[1]), "coo",
                              row_sorted=coalesced, coalesced=coalesced, trusted=True)
    if coalesced and not recoalesce:
        pattern.cache.coo_indices = x._indices()
    return _Attached(_key(x), pattern, recoalesce)


def _entries(n: int) -> str:
    """``"1 entry"``, ``"2 entries"``: a count of entries in a message."""
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def check_coo_indices(index: Tensor, shape: Sequence[int], name: str, what: Sequence[str],
                      claimed: bool) -> None:
    """Refuse the COO indices ``index`` ``(dims, nnz)`` of a tensor of ``shape`` where one
    is negative or past its dimension (``what[d]`` names dimension ``d``), or, where the
    tensor is marked coalesced (``claimed``), where they are not sorted and unique
    (:func:`_check_coalesced_claim`).  Every dimension's min and max, and the count
    against the claim, are read back in one host synchronisation; a tensor not so
    marked pays for nothing more than the ranges."""
    if not index.shape[1]:
        return
    claim = [_index.not_increasing(index).reshape(1)] if claimed else []
    stats = torch.cat([index.amin(1), index.amax(1), *claim]).tolist()
    dims = index.shape[0]
    for d in range(dims):
        lo, hi = stats[d], stats[dims + d]
        if lo < 0:
            raise ValueError(f"{name} {what[d]} must be non-negative, got min {lo}")
        if hi >= shape[d]:
            raise ValueError(f"{name} {what[d]} must be in [0, {shape[d]}), got max {hi}")
    if claimed:
        _check_coalesced_claim(stats[-1], name)


def _check_coalesced_claim(bad: int, name: str) -> None:
    """Refuse a COO tensor marked coalesced whose indices are not sorted and unique
    (``bad`` entries out of order or repeated, :func:`_index.not_increasing`): torch
    takes ``is_coalesced=True`` (or ``_coalesced_(True)``) on the caller's word, and
    nnsparse would read its rows as sorted and its entries as distinct."""
    if bad:
        raise ValueError(
            f"{name} is marked coalesced (is_coalesced() is True), so its indices must be "
            f"sorted and unique (torch's COO invariant, unchecked unless "
            f"check_invariants=True), got {_entries(bad)} out of order or repeated; build it "
            f"without is_coalesced=True, then .coalesce() (which returns a tensor marked "
            f"coalesced as it is)")


def _csr_structure(x: Tensor, name: str, check: bool) -> _Attached:
    # (a CSR tensor has 2 sparse dimensions: dim() 2 leaves no batch or dense one)
    if x.dim() != 2:
        raise ValueError(f"{name} must be a 2-D sparse CSR batch, got shape {tuple(x.shape)}")
    crow, col = _index.csr_indices(x)
    values = _index.csr_values(x)
    rows, width = x.shape[0], x.shape[1]
    nnz = col.shape[0]
    # (torch builds a CSR tensor on int16 indices unchecked, then cannot index with them)
    if crow.dtype not in (torch.int32, torch.int64) or col.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must have int32 or int64 crow_indices and col_indices, got "
                        f"{crow.dtype} and {col.dtype}")
    if check:
        _index.count("validate")
        _check_csr(crow, col, values, rows, width, name)
    crow64, col64 = crow.to(torch.int64), col.to(torch.int64)
    row = _index.rows_from_crow(crow64, nnz)
    pattern = SparseBatch(row, col64, values.detach()[:0], (rows, width), "csr",
                          row_sorted=True, coalesced=True, trusted=True)
    pattern.cache.crow = crow64
    if col.dtype != torch.int64:
        pattern.cache.col_index = col
    return _Attached(_key(x), pattern, False)


def _check_csr(crow: Tensor, col: Tensor, values: Tensor, rows: int, width: int,
               name: str) -> None:
    """Every CSR invariant, read back in one host sync."""
    nnz = col.shape[0]
    if crow.shape[0] != rows + 1:
        raise ValueError(f"{name} crow_indices must have rows + 1 = {rows + 1} entries, "
                         f"got {crow.shape[0]}")
    if values.shape[0] != nnz:
        raise ValueError(f"{name} must have one value per column index, got {values.shape[0]} "
                         f"values for {nnz} column indices")
    zero = crow.new_zeros(())
    step_min = crow.diff().min() if rows else zero
    if nnz:
        # a column that does not increase within its row (row starts excluded)
        start = torch.zeros(nnz + 1, dtype=torch.bool, device=col.device)
        start[crow.clamp(0, nnz)] = True
        unsorted = ((col[1:] <= col[:-1]) & ~start[1:nnz]).sum().to(crow.dtype)
        col_lo, col_hi = col.min().to(crow.dtype), col.max().to(crow.dtype)
    else:
        unsorted = col_lo = col_hi = zero
    first, last, step, lo, hi, bad = torch.stack(
        [crow[0], crow[-1], step_min, col_lo, col_hi, unsorted]).tolist()
    if first != 0:
        raise ValueError(f"{name} crow_indices must start at 0, got {first}")
    if step < 0:
        raise ValueError(f"{name} crow_indices must be non-decreasing, got a step of {step}")
    if last != nnz:
        raise ValueError(f"{name} crow_indices must end at nnz = {nnz} (the number of column "
                         f"indices), got {last}")
    if nnz and lo < 0:
        raise ValueError(f"{name} column indices must be non-negative, got min {lo}")
    if nnz and hi >= width:
        raise ValueError(f"{name} column indices must be in [0, {width}), got max {hi}")
    if bad:
        raise ValueError(f"{name} column indices must increase within each row (torch's CSR "
                         f"invariant), got {_entries(bad)} out of order or repeated; build the "
                         "batch as COO and convert with .coalesce().to_sparse_csr()")


def _holds_inference(pattern: SparseBatch) -> bool:
    """Whether ``pattern``'s indices or a structure cached on it is an inference tensor:
    made under ``torch.inference_mode()``, for an inference tensor or an ordinary one
    read in that mode (an evaluation pass), which autograd cannot save for a backward."""
    def holds(item: Any) -> bool:
        if isinstance(item, Tensor):
            return item.is_inference()
        if isinstance(item, SparseBatch):  # the row-sorted and coalesced patterns
            return _holds_inference(item)
        return isinstance(item, tuple) and any(holds(t) for t in item)
    cache = pattern.cache
    return (pattern.row.is_inference() or pattern.col.is_inference()
            or any(holds(t) for t in (cache.crow, cache.column_major, cache.coo_indices,
                                      cache.col_index, cache.by_row, cache.coalesced))
            or any(holds(t) for t in cache.blocked.values())
            or any(holds(t) for t in cache.column_major_all.values()))


def _reusable_after_inference(holder: Any, holds_inference: Callable[[], bool]) -> bool:
    """The inference-mode rule of a cached structure whose ``holder`` keeps an
    ``inference`` flag (a batch's :class:`_Cache`, ``matmul``'s flat 3-D pattern).

    Used under ``torch.inference_mode()``, the holder is marked: what is built there from
    then on may be inference tensors.  Used outside it once marked, where a layer's
    backward saves the structure, it is reusable unless ``holds_inference()`` finds such a
    tensor (the caller then builds it again); otherwise the mark is cleared.  Only a
    marked holder is walked.
    """
    if torch.is_inference_mode_enabled():
        holder.inference = True
        return True
    if holder.inference:
        if holds_inference():
            return False
        holder.inference = False
    return True


def _from_tensor(x: Tensor, name: str) -> SparseBatch:
    """The batch of a torch sparse tensor: checked and attached at the first call only."""
    found = _attached(x)
    if found is None:
        found = _structure(x, name, check=True)
    elif not _reusable_after_inference(found.pattern.cache,
                                       functools.partial(_holds_inference, found.pattern)):
        found = _structure(x, name, check=False)  # (checked at its first call)
    # (an inference tensor's values are copied for autograd, as its structure is)
    return found.pattern.with_pattern_values(_index.outside_inference(_values_of(x, found)))


def _from_coo(x: Tensor, name: str) -> SparseBatch:
    return _from_tensor(x, name)


# The hint where a pair tensor copied from Lua, its indices still 1-based, first shows it:
# its largest index is its Lua width n, one past the width n it is given, and its smallest
# at least 1 (a width further off, a negative one, or an index below 1 is no Lua slip: no
# hint).
_LUA_PAIRS_HINT = (" (pair indices are 0-based: a Lua pair tensor's 1-based indices need "
                   "pairs[:, 0] - 1)")


def lua_pairs_hint(batch: SparseBatch, width: int) -> str:
    """:data:`_LUA_PAIRS_HINT` where ``batch``, a checked pair form one column wider than
    ``width``, reads as a Lua pair tensor's 1-based indices (none below 1), else ``""``.
    For an error message: one host synchronisation."""
    if batch.form not in ("pairs", "pair_list") or not batch.nnz:
        return ""
    one_based = _one_based(int(batch.col.min()), batch.width - 1, width)
    return _LUA_PAIRS_HINT if one_based else ""


def _one_based(lo: int, hi: int, width: int) -> bool:
    """Whether pair indices from ``lo`` to ``hi`` read as a Lua pair tensor's 1-based ones
    for ``width`` columns: the largest is ``width``, none below 1 (:data:`_LUA_PAIRS_HINT`)."""
    return 0 < width == hi and lo >= 1


def _from_pairs(x: Tensor, name: str, width: Optional[int]) -> SparseBatch:
    if x.dim() != 2 or x.shape[1] != 2:
        if x.numel() == 0:  # an empty row may come as torch.tensor([])
            x = x.reshape(0, 2)
        else:
            raise ValueError(f"{name} must be a pair tensor of shape (k, 2), "
                             f"got shape {tuple(x.shape)}")
    col = _pair_index(x[:, 0], name)
    try:
        check_index_range(col, width, f"{name} indices")
    except ValueError as e:  # (the error path: one more host synchronisation)
        if width and col.numel():
            lo, hi = torch.stack(list(torch.aminmax(col))).tolist()
            if _one_based(lo, hi, width):  # (a -1 is no Lua slip: no hint)
                raise ValueError(f"{e}{_LUA_PAIRS_HINT}") from None
        raise
    return SparseBatch(torch.zeros_like(col), col, x[:, 1], (1, width or 0), "pairs",
                       is_vector=True, row_sorted=True)


# The way from a CSR matrix's three arrays (scipy's indptr, indices, data) or EmbeddingBag's
# (input, offsets, per_sample_weights), given as they are where a list of rows goes, to a
# batch (a bag may repeat or reorder its indices, which CSR may not: COO, repeats summed).
_TRIPLE_HINT = ("; a (crow_indices, col_indices, values) triple is no sparse form: build the "
                "batch with torch.sparse_csr_tensor(crow, col, values, (rows, width)) (from "
                "EmbeddingBag's (input, offsets, per_sample_weights), whose bags may repeat or "
                "reorder indices: torch.sparse_coo_tensor(torch.stack([torch.repeat_interleave("
                "torch.diff(offsets, append=offsets.new_tensor([len(input)]))), input]), "
                "per_sample_weights, (len(offsets), width)))")


def _triple_hint(rows: Sequence[Tensor]) -> str:
    """:data:`_TRIPLE_HINT` where ``rows``, strided tensors whose first is 1-D (no pair row),
    read as a CSR or EmbeddingBag triple, else ``""``: three 1-D tensors, the first two
    integer, the values as long as the columns (CSR) or the input (EmbeddingBag). Integer
    values (a list of index rows is all integer too) must also have CSR's row pointers,
    from 0 to the number of columns. For an error message: one host synchronisation."""
    if len(rows) != 3 or any(r.dim() != 1 for r in rows) \
            or not all(int_dtype(r.dtype) for r in rows[:2]):
        return ""
    first, second, values = rows
    if not int_dtype(values.dtype):
        fits = values.numel() in (first.numel(), second.numel())
    else:
        fits = (values.numel() == second.numel()
                and torch.stack([first[0], first[-1]]).tolist() == [0, second.numel()])
    return _TRIPLE_HINT if fits else ""


# The way round an empty list of rows where the function has no size argument to give it
# its width: an empty sparse tensor of that width (every function taking rows takes one).
EMPTY_ROWS_TENSOR = ("an empty sparse tensor of the width n: torch.sparse_coo_tensor("
                     "torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (0, n))")
EMPTY_ROWS_WAY_ROUND = f"pass instead {EMPTY_ROWS_TENSOR}"


def _from_list(rows: Sequence[Any], name: str, width: Optional[int],
               empty: str = EMPTY_ROWS_WAY_ROUND) -> SparseBatch:
    if len(rows) == 0:
        if width is None:
            raise ValueError(f"{name} is an empty list of rows, which has no width; {empty}")
        return SparseBatch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                           torch.zeros(0), (0, width), "list", row_sorted=True, coalesced=True)
    for i, r in enumerate(rows):
        if not isinstance(r, Tensor):
            raise TypeError(f"{name}[{i}] must be a tensor, got {type(r).__name__}")
    devices = {r.device for r in rows}
    if len(devices) > 1:
        raise ValueError(f"{name} rows must be on one device, got {sorted(map(str, devices))}")
    refuse_meta(rows[0], f"{name}[0]")  # (all on one device)
    sparse = [r.layout == torch.sparse_coo for r in rows]
    if any(sparse) and not all(sparse):
        raise TypeError(f"{name} mixes sparse vectors and pair tensors; use one form per batch")
    if all(sparse):
        sizes = {tuple(r.shape) for r in rows}
        if any(len(s) != 1 for s in sizes):
            raise ValueError(f"{name} rows must be 1-D sparse vectors, got shapes {sorted(sizes)}")
        if len(sizes) > 1:
            raise ValueError(f"{name} rows must share one size, got {sorted(s[0] for s in sizes)}")
        parts = [_from_coo(r, f"{name}[{i}]") for i, r in enumerate(rows)]
        form, inferred = "list", next(iter(sizes))[0]
    else:
        bad = [r.layout for r in rows if r.layout != torch.strided]
        if bad:
            raise TypeError(f"{name} rows must be sparse COO vectors or (k, 2) pair tensors, "
                            f"got layout {bad[0]}")
        try:
            parts = [_from_pairs(r, f"{name}[{i}]", width) for i, r in enumerate(rows)]
        except ValueError as e:  # a 1-D first row is refused first, as no pair row: a triple?
            hint = _triple_hint(rows) if rows[0].dim() == 1 and rows[0].numel() else ""
            if hint:
                raise ValueError(f"{e}{hint}") from None
            raise
        form, inferred = "pair_list", max(int(p.col.max()) + 1 if p.nnz else 0 for p in parts)
    # An empty row's dtype is not the data's (torch.tensor([]) is float32 whatever the
    # rows): the rows with entries must share one dtype, which the batch keeps
    # (torch.cat would promote to the empty row's wider dtype).
    dtypes = {p.dtype for p in parts if p.nnz}
    if len(dtypes) > 1:
        raise TypeError(f"{name} rows must share one dtype, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes)) if dtypes else parts[0].dtype
    device = parts[0].device
    counts = torch.tensor([p.nnz for p in parts], device=device)
    col = torch.cat([p.col for p in parts])
    row = torch.repeat_interleave(torch.arange(len(parts), device=device), counts,
                                  output_size=col.shape[0])
    values = torch.cat([p.values if p.dtype == dtype else p.values.to(dtype) for p in parts])
    # coalesced vectors, joined row after row, make a coalesced batch (pairs are not sorted)
    coalesced = form == "list" and all(p.coalesced for p in parts)
    return SparseBatch(row, col, values, (len(parts), inferred), form, row_sorted=True,
                       coalesced=coalesced)


# The value dtypes torch's sparse kernels (coalesce, index_add, index_put) take, beside
# bool and the complex ones: not the unsigned 16-64 bit, float8, quantized or bits dtypes.
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8,
                  torch.int8, torch.int16, torch.int32, torch.int64)


def check_kernel_dtype(dtype: torch.dtype, what: str) -> None:
    """``TypeError`` for values of a dtype torch's sparse kernels lack (``what`` names them)."""
    if dtype in KERNEL_DTYPES or dtype == torch.bool or dtype.is_complex:
        return
    raise TypeError(f"{what} of dtype {dtype} are not supported: torch's sparse kernels lack "
                    f"that dtype; convert them with .to(torch.int64) or .to(torch.float32)")


def refuse_meta(t: Tensor, name: str) -> None:
    """``ValueError`` when ``t`` is on the meta device: it holds no data to read (checked
    before any of it is, where torch would fail with "Cannot copy out of meta tensor")."""
    if t.device.type == "meta":
        raise ValueError(f"{name} must hold data, got a tensor on the meta device")


def refuse_meta_device(device: Optional[torch.device]) -> None:
    """``ValueError`` for a ``device`` argument naming the meta device (tensors there
    hold no data: a model or a builder could not work on it)."""
    if device is not None and device.type == "meta":
        raise ValueError("device must hold data, got 'meta'; use 'cpu' or 'cuda'")


def _dtype_hint(got: torch.dtype, dtype: torch.dtype) -> str:
    """What to do about an input of dtype ``got`` for a weight of ``dtype`` (a refusal's
    tail; the layers', their function forms' and the compiled path's): convert either; a
    half-precision one may also run under autocast."""
    amp = (", or run the forward under torch.autocast, which reads it in the weight's dtype"
           if got in (torch.float16, torch.bfloat16) and dtype.is_floating_point else "")
    layer = f" or the layer (.to({got}))" if got.is_floating_point else ""
    return f"; convert the input (x.to({dtype})){layer}{amp}"


def _operand_dtype_hint(arg: str, got: torch.dtype, dtype: torch.dtype) -> str:
    """The tail of "``arg`` must have input's dtype ``dtype``, got ``got``": an integer or
    bool ``arg`` (a weight or bias) beside a floating input is the one to convert (the
    input converted to it would be refused next, floating-point being needed); else
    :func:`_dtype_hint`'s advice for the input."""
    if dtype.is_floating_point and not (got.is_floating_point or got.is_complex):
        return f"; convert {arg} ({arg}.to({dtype}))"
    return _dtype_hint(dtype, got)


def scipy_sparse_hint(x: Any, name: str) -> str:
    """The conversion to name when ``x`` is a scipy.sparse matrix or array (the common sparse
    form outside torch), for the end of a ``TypeError`` refusing it; ``""`` for anything else.

    nnsparse takes no scipy object (scipy is no dependency, and is not imported here):
    ``x`` is recognised by its class's methods, ``tocsr`` and ``tocoo``, and its ``shape``
    (a property in scipy), all read on the class: nothing of ``x`` runs (a property of a
    stranger object may raise, or do anything)."""
    cls = type(x)
    if issubclass(cls, Tensor) or not (callable(getattr(cls, "tocsr", None))
                                       and callable(getattr(cls, "tocoo", None))
                                       and hasattr(cls, "shape")):
        return ""
    # tocsr() sums a COO's duplicates, not a CSR's (itself), a CSC's or a BSR's: the canonical
    # check names what nnsparse's own CSR check would refuse (unsorted or repeated columns)
    return (f"; nnsparse takes torch sparse tensors, not scipy.sparse ones: convert it with "
            f"m = {name}.tocsr(); torch.sparse_csr_tensor(m.indptr, m.indices, m.data, "
            f"m.shape) (m.sum_duplicates() first if not m.has_canonical_format)")


def as_sparse_batch(x: Any, *, name: str = "input", width: Optional[int] = None,
                    pairs: bool = True, bound: Optional[str] = None,
                    empty: str = EMPTY_ROWS_WAY_ROUND) -> SparseBatch:
    """Normalise any accepted sparse form to a :class:`SparseBatch`.

    Args:
        x: a sparse COO vector or batch, a sparse CSR batch, a ``(k, 2)`` pair
            tensor, or a list of sparse vectors or of pair tensors.
        name: the argument's name, used in error messages.
        width: the number of columns when the caller knows it; entries must
            lie below it.  Inferred otherwise (a torch tensor's size, or the
            largest pair index + 1).
        pairs: accept a lone strided ``(k, 2)`` tensor as a Lua pair vector
            (the toolkit functions); layers and criteria pass False, for
            which a strided tensor is dense, never sparse.
        bound: what ``width`` is, by its argument's name (``"in_features"``),
            for the message refusing a wider tensor; ``None``: "the size asked
            for".
        empty: the way round offered when ``x`` is an empty list of rows and no
            ``width`` is given (an empty list holds no width): by default an empty
            sparse tensor of the width; a function with a size argument names it.

    Raises:
        TypeError: ``x`` is not one of the accepted forms (for a scipy.sparse
            matrix, the message names the conversion: :func:`scipy_sparse_hint`).
        ValueError: bad shape, negative, non-integer or out-of-range indices,
            invalid CSR row pointers, rows on different devices, a tensor on the
            meta device.
        NotImplementedError: a hybrid sparse tensor or another sparse layout.
    """
    if isinstance(x, Tensor):
        refuse_meta(x, name)
        if x.layout == torch.sparse_csr and torch.compiler.is_compiling():
            # dynamo and export fail on it deep in the check ("tuple index out of range")
            raise NotImplementedError(
                f"{name}: a torch sparse CSR tensor cannot enter a graph of torch.compile or "
                f"torch.export; give the compiled or exported model nnsparse.sparse_parts("
                f"{name}) instead (docs/compile_amp.md)")
        if x.layout == torch.sparse_coo or x.layout == torch.sparse_csr:
            batch = _from_tensor(x, name)
        elif x.layout == torch.strided:
            if not pairs:
                raise TypeError(
                    f"{name} must be sparse, got a dense (strided) tensor of shape "
                    f"{tuple(x.shape)}; convert it with nnsparse.sparsify(x) (or x.to_sparse()); "
                    "a Lua (k, 2) pair vector goes through nnsparse.from_pairs(x, size=n), n "
                    "its width (without size= its width is its largest index + 1)")
            batch = _from_pairs(x, name, width)
            if width is None:
                batch = replace(batch, shape=(1, int(batch.col.max()) + 1 if batch.nnz else 0))
        else:
            raise NotImplementedError(
                f"{name}: layout {x.layout} is not supported; convert with .to_sparse_coo() "
                "or .to_sparse_csr()")
    elif isinstance(x, (list, tuple)):
        if type(x).__name__ == "SparseParts":  # a NamedTuple: not a list of rows (no import cycle)
            raise TypeError(f"{name} is a SparseParts (the torch.compile input form), which the "
                            f"layers read; pass {name}.to_sparse_csr() to eager nnsparse "
                            f"functions and criteria")
        if hasattr(x, "_fields") or hasattr(x, "n_fields"):  # a NamedTuple or torch.return_types
            fields, kind = _field_names(x), type(x).__name__
            what, advice = "", "a sparse tensor, or the rows as a list"
            if fields == ["values", "indices"]:  # (torch.max, median, mode... give them too)
                what = ("the dense result of a sort or top-k, " if kind in _SORTS
                        else "the dense (values, indices) result of a reduction, ")
                advice = "the sparse batch it was computed from"
            raise TypeError(f"{name} is a {kind} ({', '.join(fields)}), {what}not a sparse "
                            f"batch nor a list of rows; pass {advice}")
        batch = _from_list(x, name, width, empty)
    else:
        # a DataLoader's batch passed whole (the SparseRowDataset loop's first slip; by name:
        # nnsparse.data imports this module)
        batch_hint = ("; unpack the loader's batch first: x, y = batch (or batch.input)"
                      if type(x).__name__ == "SparseRowBatch" else "")
        raise TypeError(f"{name} must be a sparse tensor, a pair tensor or a list of sparse "
                        f"rows, got {type(x).__name__}{batch_hint}"
                        f"{scipy_sparse_hint(x, name)}")
    if width is not None and width != batch.width:
        if width < batch.width:
            raise ValueError(f"{name} has width {batch.width}, larger than {bound} {width}"
                             if bound is not None else
                             f"{name} has width {batch.width}, larger than the size "
                             f"asked for, {width}")
        cache = batch.cache
        batch = replace(batch, shape=(batch.rows, width))
        batch.cache = cache  # the pattern is the same; only the declared width grew
    return batch


# the (values, indices) results of sorts: torch.sort's and torch.topk's, nnsparse.sort's
_SORTS = ("sort", "topk", "SortResult", "TopkResult")


def _field_names(x: Any) -> List[str]:
    """The field names of a NamedTuple or of a ``torch.return_types`` structseq."""
    fields: Any = getattr(x, "_fields", None)
    if fields is None:  # a structseq: its member descriptors, in field order (not its
        # __match_args__, which Python 3.9 lacks: a sort result was "a sort ()" there)
        kind = type(x)
        named = [k for k, v in vars(kind).items() if isinstance(v, types.MemberDescriptorType)]
        fields = named[:getattr(kind, "n_sequence_fields", 0)]
    return [str(f) for f in fields]


def holds_exactly(dtype: torch.dtype, value: float) -> bool:
    """Whether tensors of ``dtype`` store the real ``value`` as given (a cast would
    not change it silently, nor fail): a floating dtype any value up to its largest
    finite one (rounded, as torch rounds) or inf or nan, bool 0 or 1, an integer
    dtype a whole number in its range; a complex dtype any."""
    if dtype.is_complex:
        return True
    if dtype.is_floating_point:
        return not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    if dtype == torch.bool:
        return value in (0, 1)
    info = torch.iinfo(dtype)
    return math.isfinite(value) and value == int(value) and info.min <= value <= info.max


def _exact_index_limit(dtype: torch.dtype) -> Optional[float]:
    """2 ** (mantissa bits + 1): ``dtype`` holds every whole number up to it exactly, not
    the next.  Found by rounding ``2 ** k + 1`` (``torch.finfo(dtype).eps`` is half the
    true one for float8_e5m2fnuz: 2 / eps said 16, but 9 rounds); None for a float dtype
    torch cannot convert to."""
    for k in range(1, 64):
        n = 2 ** k + 1
        try:
            back = float(torch.tensor(float(n), dtype=torch.float64).to(dtype).double())
        except (RuntimeError, TypeError, NotImplementedError):  # float4_e2m1fn_x2
            return None
        if back != n:  # (float(n) itself rounds for float64: 2 ** 53 + 1)
            return 2.0 ** k
    return None


def _holds_zero(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds 0 (float8_e8m0fnu, exponent-only, holds powers of two only:
    0 becomes 2 ** -127); True for a dtype torch cannot convert to (left to its own check)."""
    try:
        return float(torch.zeros((), dtype=torch.float64).to(dtype).double()) == 0.0
    except (RuntimeError, TypeError, NotImplementedError):
        return True


_FLOAT_DTYPES = {d for d in vars(torch).values()
                 if isinstance(d, torch.dtype) and d.is_floating_point}
#: The floating dtypes that cannot hold the index 0 (float8_e8m0fnu): refused for indices,
#: whatever their values (:func:`exact_index`, a pair tensor's index column).
NO_INDEX: FrozenSet[torch.dtype] = frozenset(d for d in _FLOAT_DTYPES if not _holds_zero(d))
#: The largest index a floating dtype holds exactly, with every smaller whole number down to
#: 0 (an index stored as a pair tensor's or an appended row's value): float64 2 ** 53,
#: float32 2 ** 24, float16 2048, float8 16 (8 for the e5m2 kinds); none for the
#: :data:`NO_INDEX` dtypes; made once, at import.
EXACT_INDEX: Dict[torch.dtype, float] = {
    dtype: limit for dtype in _FLOAT_DTYPES - NO_INDEX
    if (limit := _exact_index_limit(dtype)) is not None}


def no_index_error(dtype: torch.dtype, what: str, fix: str, them: str = "them") -> TypeError:
    """The refusal of a :data:`NO_INDEX` ``dtype`` for ``what`` (indices): "``what`` must be
    stored in a dtype that holds 0 and every whole number up to ``them``, got ...; ``fix``"."""
    return TypeError(f"{what} must be stored in a dtype that holds 0 and every whole number "
                     f"up to {them}, got {dtype}, which cannot hold 0; {fix}")


def exact_index(dtype: torch.dtype, what: str = "indices",
                fix: str = "store them as float64 or int64") -> float:
    """:data:`EXACT_INDEX` of a floating ``dtype``, or of a complex one's real part
    (``2 / eps`` for a dtype torch cannot convert to); a :data:`NO_INDEX` dtype is
    :func:`no_index_error`'s ``TypeError`` naming ``what``, with ``fix``."""
    real = dtype.to_real() if dtype.is_complex else dtype
    if real in NO_INDEX:
        raise no_index_error(real, what, fix)
    limit = EXACT_INDEX.get(real)
    return 2.0 / torch.finfo(real).eps if limit is None else limit


def as_int(value: Any, name: str, must: str = "be an int",
           expected: Optional[str] = "an int") -> int:
    """``value`` as a Python int: ints, numpy ints and 0-d integer tensors pass
    (``operator.index``); a bool (a bool tensor too), a float (even whole) or anything else is a
    ``TypeError`` "``name`` must ``must``, got ...". The one int check of nnsparse's sizes.

    An int beyond int64, which no torch size holds, is a ``ValueError`` in
    :func:`int64_message`'s words, "``name`` must be ``expected`` within int64 (below 2**63),
    got ..." (before, a width or a size passed on reached torch's unnamed "Overflow when
    unpacking long long"); one below zero is the caller's to refuse, in its words.
    ``expected=None``: no int64 check, for an int the caller bounds tighter (``ndim``, at
    most 64), in its own words.

    A 0-d tensor or numpy array is read as every count reads it (:func:`int_of_0d`): a meta
    one is a ``ValueError`` naming ``name``, and a uint64 beyond int64 is its Python int,
    refused as a numpy uint64 is (``operator.index`` gave torch's unnamed ``RuntimeError``
    for both)."""
    value = int_of_0d(value, name)
    # A tensor left is no int, though it has __index__: one of one element but more
    # dimensions (a (1, 1) tensor), or a 0-d bool one (True is no size, as True itself is
    # refused).  (Not as_count's check: the messages differ, "must be an int, got bool
    # True" here, and an object with __index__ alone passes; the callers' tests pin both.)
    if not isinstance(value, (bool, Tensor)):
        try:
            number = operator.index(value)
        except TypeError:
            pass
        else:
            return number if expected is None else check_int64(number, name, expected)
    raise TypeError(f"{name} must {must}, got {type(value).__name__} {value!r}")


def check_int64(value: int, name: str, expected: str = "an int") -> int:
    """``value`` (an int already checked) unless it is beyond int64, which no torch size
    holds (torch's "Overflow when unpacking long long"): :func:`int64_message`'s error."""
    if value > _INT64_MAX:
        raise ValueError(int64_message(name, value, expected))
    return value


def int64_message(name: str, value: int, expected: str = "an int",
                  got: Optional[str] = None) -> str:
    """The one wording of an integer argument beyond int64: "``name`` must be ``expected``
    within int64 (below 2**63), got ``value``" ("at least -2**63" for a ``value`` below
    it); ``got`` words what came instead of ``value`` (an entry of a tensor)."""
    bound = "at least -2**63" if value < 0 else "below 2**63"
    return f"{name} must be {expected} within int64 ({bound}), got {value if got is None else got}"


def check_numel(sizes: Sequence[int], name: str, got: Optional[str] = None) -> Tuple[int, ...]:
    """``sizes`` as a tuple unless their product, a tensor's element count, passes int64
    (torch's sparse constructors: "numel: integer multiplication overflow").  The one
    wording: "``name`` must have at most 2**63 - 1 elements (torch counts them in int64),
    got ``sizes``"; ``got`` words what came instead (with the sizes in it).  Sizes whose
    running product passes 2**64 before a 0 are refused too, as torch refuses them."""
    sizes = tuple(int(n) for n in sizes)
    if math.prod(sizes) > _INT64_MAX:
        raise ValueError(f"{name} must have at most 2**63 - 1 elements (torch counts them in "
                         f"int64), got {sizes if got is None else got}")
    if any(math.prod(sizes[:i]) >= 2 ** 64 for i in range(2, len(sizes))):
        # torch multiplies in turn in uint64 and keeps an overflow: a 0 after does not undo it
        raise ValueError(f"{name} must keep the product of its first sizes below 2**64 (torch "
                         f"multiplies them in turn, a 0 after them included), got "
                         f"{sizes if got is None else got}")
    return sizes


def as_choice(value: Any, name: str, choices: Sequence[str], listed: Optional[str] = None,
              then: str = "") -> str:
    """``value`` checked as one of the str ``choices``: a ``TypeError`` for another kind
    (``None``, an int), a ``ValueError`` for another str: "``name`` must be ``listed``
    (a str), got ...".  ``listed`` defaults to "one of [...]"; ``then`` ends both
    messages.  The one check of choice arguments (a kind wrong, or a value).

    Returns the plain str the choice holds: a numpy str, a str enum member
    (``class Mode(str, Enum)``) or any str subclass passes as its characters (not as
    ``str(value)``, which is ``'Mode.DENSE'`` for such an enum member)."""
    listed = listed or f"one of {list(choices)}"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {listed} (a str), got {type(value).__name__} "
                        f"{value!r}{then}")
    if value not in choices:
        raise ValueError(f"{name} must be {listed}, got {value!r}{then}")
    return str.__str__(value)  # the characters: str() of a str enum member is its name


#: io's concrete file objects, whose readable() / writable() are right where inherited
_IO_FILES = (io.FileIO, io.BufferedReader, io.BufferedWriter, io.BufferedRandom,
             io.BufferedRWPair, io.BytesIO)


def check_file_object(f: Any, name: str, use: str) -> None:
    """Refuse a file object ``torch.save`` (``use="write"``) or ``torch.load``
    (``use="read"``) cannot use, before it is given one: a closed file, a text file (torch
    writes and reads bytes), one not open for ``use``.  torch's own errors came from deep
    inside it ("write() argument must be str, not memoryview", "write to closed file",
    a bare "write").  Objects without ``closed`` / ``writable`` / ``readable`` (a bare
    object with ``write``), and streams that keep ``io.IOBase``'s own ``writable()`` /
    ``readable()`` (False whatever the stream does: a ``RawIOBase`` subclass defining
    ``write`` or ``readinto`` only, which torch uses), are left to torch."""
    kind = type(f).__name__
    if getattr(f, "closed", False) is True:
        raise ValueError(f"{name} is a closed file object ({kind}); open it again to {use}")
    mode = "'wb'" if use == "write" else "'rb'"
    if isinstance(f, io.TextIOBase):
        raise TypeError(f"{name} must be a binary file object (open(..., {mode}), io.BytesIO), "
                        f"got a text one ({kind}): torch {use}s bytes")
    method = "writable" if use == "write" else "readable"
    able = getattr(f, method, None)
    # io.IOBase's own method answers False for a stream that does not say; io's concrete
    # files inherit it where it is true (BufferedReader.writable)
    said = getattr(type(f), method, None) is not getattr(io.IOBase, method) \
        or isinstance(f, _IO_FILES)
    if said and callable(able) and able() is False:
        opened = getattr(f, "mode", None)  # (gzip.GzipFile's is an int: not shown)
        raise ValueError(f"{name} must be a file object open to {use} (open(..., {mode})), "
                         f"got one that is not" + (f" (mode {opened!r})"
                                                   if isinstance(opened, str) else ""))


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _function_modes_on() -> bool:
    """Whether a torch function mode is on (a default device is one: DeviceContext)."""
    modes_on = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    return True if modes_on is None else bool(modes_on())


@contextlib.contextmanager
def cpu_default() -> Iterator[None]:
    """torch's default device set to the CPU inside the block when another is set
    (``torch.set_default_device("cuda")``, a ``with torch.device(...)`` block): the tensors
    nnsparse makes without a ``device`` (counts, fallbacks, indices, the models' layers
    before they move) are then made on the CPU, as the code expects, not on that device
    (where they met CPU tensors, or the meta device's "no data").  Nothing is pushed, and
    nothing costs, when the default is already the CPU; with another default, every torch
    call inside goes through torch's mode dispatch (a small CPU fit ran about 3x slower,
    70 ms against 208 ms: slower, where it had failed)."""
    if not _function_modes_on() or torch.get_default_device().type == "cpu":
        yield  # (no mode on, so no default device: a 37 ns test, not get_default_device's 3 µs)
        return
    with torch.device("cpu"):
        yield


def on_cpu_default(fn: _Fn) -> _Fn:
    """``fn`` run inside :func:`cpu_default` (for the models' public methods)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with cpu_default():
            return fn(*args, **kwargs)
    return cast(_Fn, wrapper)


def _callback_reader(eval_frame: Any, modules: Mapping[str, Any] = sys.modules
                     ) -> Callable[[], Any]:
    """How to read dynamo's eval-frame callback: set while torch.compile runs, None when
    it is off.  ``eval_frame.get_eval_frame_callback`` (``torch._C._dynamo``), a C
    function, 13 ns, is private: a torch without it gets a stand-in that says "on" once
    ``torch._dynamo`` is loaded (torch.compile cannot run before), so that a torch sparse
    input under torch.compile takes the disabled path (correct) and an eager program that
    never loads dynamo keeps its direct calls (the disabled path costs an eager call about
    3 us, and its first use loads torch._dynamo, about 1 s)."""
    read = getattr(eval_frame, "get_eval_frame_callback", None)
    if callable(read):
        return cast(Callable[[], Any], read)
    return lambda: True if "torch._dynamo" in modules else None


_eval_frame_callback: Callable[[], Any] = _callback_reader(
    getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None))
# True while dynamo traces (constant-folded there), False in eager: 14 ns
_dynamo_tracing: Callable[[], bool] = getattr(torch.compiler, "is_dynamo_compiling",
                                              torch.compiler.is_compiling)
_exporting: Callable[[], bool] = getattr(torch.compiler, "is_exporting", lambda: False)

# why the boundary breaks the graph: dynamo prints it in the break reasons and in the error
# of fullgraph=True
_BREAK_REASON = ("nnsparse runs a module or function given a torch sparse tensor (or a list "
                 "of rows) eagerly, out of the graph; to compile it too, give the compiled "
                 "model nnsparse.sparse_parts(x) (docs/compile_amp.md)")


def _untraceable(x: Any) -> bool:
    """Whether ``x`` is a sparse form dynamo cannot fake: a torch sparse tensor, or a list
    or plain tuple of rows (not a ``SparseParts``, a NamedTuple of plain tensors, nor a
    dense tensor)."""
    # (dynamo's error under fullgraph=True may quote the next line, the hint included)
    if isinstance(x, Tensor):  # fullgraph=True and a sparse x: pass nnsparse.sparse_parts(x)
        return x.layout != torch.strided
    return isinstance(x, list) or (isinstance(x, tuple) and not hasattr(x, "_fields"))


def compile_boundary(forward: _Fn) -> _Fn:
    """``forward`` (a module's forward, or a public function), run eagerly and out of the
    graph when torch.compile gives it a sparse form dynamo cannot fake
    (:func:`_untraceable`): a graph break at the nnsparse module or function, where a CSR
    tensor failed inside dynamo ("IndexError: tuple index out of range").  A
    ``SparseParts`` input, dense inputs, and every call with torch.compile off take
    ``forward`` itself (the test costs an eager call about 0.1 us).

    dynamo cannot trace the test on a torch sparse tensor either (it cannot wrap one): it
    gives up on the frame and runs it as Python, its callback still set, where the test
    sees the callback and takes the disabled path as well.  The disabling is recursive:
    dynamo traces none of the frames ``forward`` calls.
    """
    return _boundary(forward, always=False)


def sparse_output_boundary(forward: _Fn) -> _Fn:
    """:func:`compile_boundary` for a forward or function that makes a torch sparse tensor
    from dense ones (``Sparsify``, ``sparsify``, ``from_pairs``): under torch.compile it
    always runs eagerly, as dynamo cannot hold its output."""
    return _boundary(forward, always=True)


# every function behind a boundary, and its torch.compiler.disable form once made
_BEHIND_BOUNDARY: List[Callable[..., Any]] = []
_DISABLED: Dict[Callable[..., Any], Callable[..., Any]] = {}


def _disabled(forward: _Fn) -> _Fn:
    """``forward`` wrapped by ``torch.compiler.disable``.  Made at the first use, for
    every boundary at once: making them imports torch._dynamo (1 s), which an eager
    program need not load.  A first use inside dynamo's tracing (a list of rows; a torch
    sparse tensor is met in the frame dynamo gave up on, as Python) breaks the graph at
    the call to ``torch.compiler.disable`` itself, which fullgraph=True then names."""
    if forward not in _DISABLED:
        disable = torch.compiler.disable
        for fn in _BEHIND_BOUNDARY:
            try:
                _DISABLED[fn] = disable(fn, reason=_BREAK_REASON)  # type: ignore[no-untyped-call]
            except TypeError:  # (an older torch has no reason=)
                _DISABLED[fn] = disable(fn)  # type: ignore[no-untyped-call]
    return cast(_Fn, _DISABLED[forward])


def _boundary(forward: _Fn, always: bool) -> _Fn:
    _BEHIND_BOUNDARY.append(forward)

    @functools.wraps(forward)
    def boundary(*args: Any, **kwargs: Any) -> Any:
        # dynamo traces this line, or runs it as Python in a frame it gave up on (its
        # callback still set); torch.export (which dynamo may run) keeps forward's message
        if ((_dynamo_tracing() or _eval_frame_callback() is not None) and not _exporting()
                and (always or any(_untraceable(a) for a in args)
                     or any(_untraceable(a) for a in kwargs.values()))):
            return _disabled(forward)(*args, **kwargs)
        return forward(*args, **kwargs)
    return cast(_Fn, boundary)


def as_tensor(value: Any) -> Tensor:
    """``torch.as_tensor(value)``, but a numpy array with a negative stride (``np.flip(a)``,
    ``a[::-1]``), which torch cannot share and refuses ("At least one stride in the given
    numpy array is negative"), is copied first, as numpy's other arrays are taken."""
    if isinstance(value, np.ndarray) and any(step < 0 for step in value.strides):
        value = value.copy()
    return torch.as_tensor(value)


def plain(t: Tensor) -> Tensor:
    """``t``, or, for a Tensor subclass with a ``__torch_function__`` of its own, a plain
    ``Tensor`` alias of it (``t.as_subclass(Tensor)``: the same storage, on the same
    autograd graph).  torch's default ``__torch_function__`` casts each result to the
    subclass: a sparse result cannot take it (torch 2.13: "Sparse CSR tensors do not
    have strides"), and a statistic kept from such data would be of the subclass, which
    ``copy.deepcopy`` and a ``weights_only`` load refuse.  ``nn.Parameter`` (torch
    functions disabled) and plain tensors come back as they are."""
    if type(t) is Tensor or not torch.overrides.has_torch_function((t,)):
        return t
    return t.as_subclass(Tensor)


def dtype_got(value: Any) -> str:
    """How a refusal words a ``dtype=`` that came: a ``torch.dtype`` as torch prints it;
    anything else by kind and value, with the torch dtype its name means, if any (the
    str ``'float64'`` printed as ``float64`` read as the dtype itself): ``str 'float64'
    (use torch.float64)``, ``type <class 'numpy.float64'> (use torch.float64)``."""
    if isinstance(value, torch.dtype):
        return str(value)
    text = f"{type(value).__name__} {value!r}"
    name = (value if isinstance(value, str) else getattr(value, "name", None)
            if isinstance(value, np.dtype) else getattr(value, "__name__", None))
    found = getattr(torch, name.split(".")[-1], None) if isinstance(name, str) else None
    if isinstance(found, torch.dtype):
        text += f" (use {found})"
    return text


def as_flag(value: Any, name: str, what: str = "a bool") -> bool:
    """``value`` as a Python bool: ``True``/``False`` and numpy bools (``np.True_``, which
    torch's own flags take) pass; anything else, an int 0/1 or a 0-d tensor included, is
    a ``TypeError`` "``name`` must be ``what``, got ...".  The one check of flags."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")


def as_count(name: str, value: Any, low: int, *, must: Optional[str] = None) -> int:
    """``value`` as a Python int ``>= low``: "``name`` must be an int >= ``low``, got ...",
    a ``TypeError`` for another kind (a bool, a float, even whole, a str), a ``ValueError``
    for an int below ``low`` or beyond int64.  The check of every public count and
    integer hyperparameter (sizes, ``k``, batch sizes, epochs, folds).

    ``must`` words the bound instead: ``"positive"`` (``low`` 1) or ``"non-negative"``
    (``low`` 0) give "``name`` must be a positive int, got ...", the wording of the
    arguments that said so before they came here (offsets, ``k``, sizes of data).

    One rule for every count: a Python int, a numpy integer or a 0-d integer tensor or
    numpy array (as ``torch.topk``'s ``k`` and ``nn.Linear``'s sizes take one) is taken as
    its int;
    a bool, a 0-d bool, floating or complex tensor, and a tensor of another shape (even
    of one element) are refused with the ``TypeError`` above.  (Until session 16 the
    counts that torch's counterparts take as Python ints only, ``DataLoader``'s
    ``batch_size`` or epochs, refused a tensor: ``docs/bad_inputs_probe8.md``.)"""
    value = int_of_0d(value, name)
    if must is None:
        kind = f"an int >= {low}"
    elif _BOUND_WORDS.get(must) == low:
        kind = f"a {must} int"
    else:  # a caller's slip, not a user's: the words would misstate the bound
        raise ValueError(f"must={must!r} does not word the bound low={low}")
    if not is_int(value):
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    # torch, DataLoader and islice take no count beyond int64
    return check_int64(int(value), name, kind)


def int_of_0d(value: Any, name: str) -> Any:
    """A 0-d integer tensor's or numpy array's Python int (a meta one refused naming
    ``name``); any other ``value`` as it came, for the check that follows
    (:func:`as_count`'s and :func:`as_int`'s rule, ``Trainer.fit``'s ``epochs``)."""
    if isinstance(value, np.ndarray):  # (torch.topk and nn.Linear take np.array(3) too)
        return value.item() if value.ndim == 0 and int_kind(value.dtype) else value
    if isinstance(value, Tensor) and value.dim() == 0 and int_dtype(value.dtype):
        refuse_meta(value, name)  # (item() would read it)
        # item(), not operator.index: a uint64 beyond int64 is then a Python int, refused
        # by the check that follows, naming the argument (operator.index raised torch's
        # "cannot be converted to type int64_t without overflow")
        return value.item()
    return value


def int_kind(dtype: np.dtype[Any]) -> bool:
    """Whether a numpy ``dtype`` is of an integer kind, signed or unsigned (``kind`` ``'i'``
    or ``'u'``): the one test of a numpy integer, array or scalar (:func:`is_int`), for
    counts, sizes and indices.  Not ``np.issubdtype(dtype, np.integer)``: numpy files
    timedelta64 (kind ``'m'``) under ``np.integer``, but torch takes no duration as an int
    (nor a timedelta64 array as a tensor), and a duration with a unit reads as a
    ``datetime.timedelta`` (``item()``)."""
    return dtype.kind in "iu"


def int_dtype(dtype: torch.dtype) -> bool:
    """Whether a torch ``dtype`` is an integer one, signed or unsigned: neither floating,
    complex nor bool (torch has no public test of it), the one test of an index or id
    tensor's dtype."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int as the counts take one: a Python int or a numpy integer
    of an integer kind (:func:`int_kind`; ``numbers.Integral`` takes a ``np.timedelta64``
    too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and not (
        isinstance(value, np.generic) and not int_kind(value.dtype))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number as the hyperparameters take one: a
    ``numbers.Real`` (a Python int or float, a numpy integer or float, a ``Fraction``), not
    a bool, nor a ``np.timedelta64`` (an Integral, hence a Real, to ``numbers``, which
    ``float()`` reads as its count: :func:`is_int`'s rule for the integers)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and (
        is_int(value) or not isinstance(value, numbers.Integral))


def real_float(value: Any) -> float:
    """``float(value)`` of a real number (:func:`is_real`), ``inf`` or ``-inf`` where it is
    beyond float's range (an int from ``2**1024``, a ``Fraction``): ``float()`` raised
    ``OverflowError`` ("int too large to convert to float"), which named no argument, and
    ``math.isfinite`` the same."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def check_real(name: str, value: Any,
               layouts: Tuple[torch.layout, ...] = (torch.strided,)) -> None:
    """``value`` is a hyperparameter's real number: :func:`is_real`, or a one-element real
    tensor of one of ``layouts`` (the optimisers': strided) holding data (a 0-d tensor
    counts); not a bool, a str, a complex, a tensor of another layout or a meta tensor
    (``float()`` of a CSR or meta tensor raised torch's errors, which named no
    argument)."""
    if not (is_real(value) or isinstance(value, Tensor)) or (  # (nor a np.timedelta64)
            isinstance(value, Tensor) and (value.numel() != 1 or value.is_complex()
                                           or value.dtype == torch.bool
                                           or value.layout not in layouts)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if isinstance(value, Tensor) and value.is_meta:  # (the range checks read it: .item())
        raise ValueError(f"{name} must hold data, got a tensor on the meta device")


def as_real_float(name: str, value: Any) -> float:
    """``float(value)`` of a hyperparameter checked by :func:`check_real`, as torch takes
    ``max_norm``: a real number or a one-element tensor, strided or sparse COO (whose
    ``float()`` torch's clip functions take too; an int beyond float's range is ``inf``,
    :func:`real_float`)."""
    check_real(name, value, (torch.strided, torch.sparse_coo))
    return float(value) if isinstance(value, Tensor) else real_float(value)


# as_count's bounds in words, with the low each one means
_BOUND_WORDS = {"positive": 1, "non-negative": 0}

_INT64_MAX = 2 ** 63 - 1

# Letters whose spoken name starts with a vowel sound ("an MSELoss", "an nn.Module").
_VOWEL_NAMED_LETTERS = frozenset("aefhilmnorsx")
# Vowel-letter starts that sound like "you" or "wun" ("a UserModel", "a OneHot").
_CONSONANT_SOUNDING = ("uni", "use", "usu", "uti", "ure", "one", "once", "eu")


def _a(word: str) -> str:
    """``word`` after the indefinite article its first sound takes, for messages that
    name a class, a dtype or a kind held in a variable: ``"an AutoRec"``, ``"a CFN"``,
    ``"an 'adam'"``, ``"an 8-D"``.  Quotes before the word are skipped; a word whose
    leading letters are an acronym (two capitals, or no vowel) is read letter by letter.
    """
    head = word.lstrip("'\"`(<[")
    digits = head[:len(head) - len(head.lstrip(string.digits))]
    if digits:  # "an 8", "an 11", "an 18", "an 80"...: read as "eight", "eleven", ...
        vowel = digits[0] == "8" or (len(digits) % 3 == 2 and digits[:2] in ("11", "18"))
    else:
        letters = head[:len(head) - len(head.lstrip(string.ascii_letters))]
        if letters[:2].isupper() or (letters and not set(letters.lower()) & set("aeiouy")):
            vowel = letters[0].lower() in _VOWEL_NAMED_LETTERS
        else:
            low = letters.lower()
            vowel = low[:1] in ("a", "e", "i", "o", "u") and not low.startswith(_CONSONANT_SOUNDING)
    return f"{'an' if vowel else 'a'} {word}"


@overload
def as_device(device: Any, *, present: bool = True) -> torch.device: ...


@overload
def as_device(device: Any, none: bool, present: bool = True) -> Optional[torch.device]: ...


def as_device(device: Any, none: bool = False, present: bool = True) -> Optional[torch.device]:
    """``device`` as a ``torch.device`` (``None`` passes through when ``none``).

    A ``TypeError`` for another kind than a name, an index or a ``torch.device``;
    a ``ValueError`` for a name torch does not know, or (with ``present``) a device this
    machine lacks (``'cuda'`` on a torch built without CUDA: torch's ``AssertionError`` at
    the first tensor).  The one device check of nnsparse's arguments.  ``present=False``
    for a device read from a file, which may have been written on another machine.
    """
    if device is None and none:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"device must be {'None, ' if none else ''}a torch.device or a name "
                        f"such as 'cpu' or 'cuda:0', got {type(device).__name__}")
    try:
        out = torch.device(device)
    except (RuntimeError, ValueError) as e:
        # an index is an accelerator's: torch refuses it on a machine without one
        why = f" ({str(e).splitlines()[0]})" if isinstance(device, int) else ""
        raise ValueError(f"device must be a torch.device or a name such as 'cpu' or "
                         f"'cuda:0', got {device!r}{why}") from None
    if present and out.type not in ("cpu", "meta"):
        missing = _device_missing(out)
        if missing is not None:
            raise ValueError(f"device must be one this machine has, got {str(out)!r} "
                             f"({missing})")
    return out


# device -> None (it works) or why not: one tiny allocation per device and process, so a
# batch's to(device) at every step costs a dict lookup
_DEVICES: Dict[torch.device, Optional[str]] = {}


def _device_missing(device: torch.device) -> Optional[str]:
    if device not in _DEVICES:
        try:
            torch.empty(0, device=device)
            _DEVICES[device] = None
        except (RuntimeError, AssertionError, NotImplementedError) as e:
            _DEVICES[device] = str(e).split("\n")[0][:200]
    return _DEVICES[device]


def resolve_size(given: Optional[Sequence[int]], batch: SparseBatch, name: str = "size") -> Tuple[int, int]:
    """The ``(rows, width)`` a result should have: ``given`` checked against the data."""
    if given is None:
        return batch.shape
    rows, width = (as_int(v, name, "hold ints") for v in given)
    if rows < batch.rows:
        raise ValueError(f"{name} must have at least {batch.rows} rows, got {rows}")
    if width < batch.width:
        raise ValueError(f"{name} must have at least {batch.width} columns, got {width}"
                         f"{lua_pairs_hint(batch, width)}")
    return int(rows), int(width)


def move_structure(src: Tensor, dst: Tensor, non_blocking: bool = False) -> Tensor:
    """Give ``dst`` (``src`` moved to another device) ``src``'s checked structure.

    A trusted or checked batch stays so after ``SparseRowBatch.to(device)``;
    the derived structures already built move with it.
    """
    found = _attached(src)
    if found is None or dst is src:
        return dst
    pattern = found.pattern
    device = dst.device
    moved = SparseBatch(pattern.row.to(device, non_blocking=non_blocking),
                        pattern.col.to(device, non_blocking=non_blocking),
                        dst.values().detach()[:0] if dst.layout == torch.sparse_csr
                        else dst._values().detach()[:0],
                        pattern.shape, pattern.form, pattern.is_vector, pattern.row_sorted,
                        pattern.coalesced, True)
    moved.cache = pattern.cache.to(device, non_blocking)
    if dst.layout == torch.sparse_csr:
        if dst.crow_indices().dtype == torch.int64:
            moved.cache.crow = dst.crow_indices()
        if dst.col_indices().dtype == torch.int64:
            moved.col = dst.col_indices()
            moved.cache.col_index = None
        else:
            moved.cache.col_index = dst.col_indices()
    elif not found.recoalesce and pattern.coalesced:
        moved.cache.coo_indices = dst._indices()
    _attach(dst, _Attached(_key(dst), moved, found.recoalesce))
    return dst


def _counts() -> Dict[str, int]:
    """A copy of the private counters of validations and structure builds."""
    return dict(_index.COUNTS)


def _reset_counts() -> None:
    _index.COUNTS.clear()


# Kept for the modules that import them under these names.
_ = (_sparse_coo, _sparse_csr, List)
