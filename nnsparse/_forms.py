"""The one normalisation of every sparse form nnsparse accepts.

Every public function, layer and criterion calls :func:`as_sparse_batch` and
works on the :class:`SparseBatch` it returns; nothing else in the package
parses user input.  The accepted forms (see ``docs/naming.md``):

* ``"coo"``: a torch sparse COO tensor, 1-D (a vector) or 2-D (a batch),
  coalesced or not (duplicates mean a sum, as torch defines);
* ``"csr"``: a 2-D torch sparse CSR tensor;
* ``"list"``: a Python list of 1-D sparse COO vectors, one per row (the Lua
  "table of sparse vectors"), rows may be empty;
* ``"pairs"``: a strided ``(k, 2)`` tensor of ``[index, value]`` rows with
  0-based indices (the Lua form of a sparse vector);
* ``"pair_list"``: a list of such pair tensors, one per row.

The batch keeps the caller's device and dtype and keeps the autograd link to
the caller's values wherever torch allows it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["SparseBatch", "as_sparse_batch", "is_sparse_form", "check_index_range", "resolve_size"]


def _sparse_coo(indices: Tensor, values: Tensor, size: Sequence[int], coalesced: bool) -> Tensor:
    # Invariant checks are done by nnsparse itself (check_index_range); asking
    # torch explicitly silences its "checks implicitly disabled" warning.
    return torch.sparse_coo_tensor(
        indices, values, tuple(size), is_coalesced=coalesced, check_invariants=False
    )


def _sparse_csr(crow: Tensor, col: Tensor, values: Tensor, size: Sequence[int]) -> Tensor:
    with warnings.catch_warnings():
        # torch warns once per process that CSR is "beta"; the user chose CSR.
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, tuple(size), check_invariants=False)


def check_index_range(index: Tensor, bound: Optional[int], name: str) -> int:
    """Raise ``ValueError`` unless every entry of ``index`` is in ``[0, bound)``.

    Returns ``max(index) + 1`` (0 when ``index`` is empty), the smallest size
    that holds the data.  ``bound=None`` only checks for negative entries.
    """
    if index.numel() == 0:
        return 0
    lo, hi = torch.aminmax(index)
    lo, hi = int(lo), int(hi)
    if lo < 0:
        raise ValueError(f"{name} must be non-negative, got min {lo}")
    if bound is not None and hi >= bound:
        raise ValueError(f"{name} must be in [0, {bound}), got max {hi}")
    return hi + 1


def _pair_index(column: Tensor, name: str) -> Tensor:
    """The int64 index column of a pair tensor, checked to hold whole numbers."""
    if column.dtype == torch.bool or column.is_complex():
        raise TypeError(f"{name} indices must be real numbers, got dtype {column.dtype}")
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
    return column.to(torch.int64)


@dataclass
class SparseBatch:
    """A sparse batch in coordinate form: what every accepted form becomes.

    ``row``/``col`` are int64 ``(nnz,)`` tensors on the values' device;
    ``values`` is ``(nnz,)`` and carries the autograd link to the caller's
    values.  A vector is a batch of one row with ``is_vector=True``.
    ``row_sorted`` says the entries are grouped by row in increasing order
    (needed for CSR); ``coalesced`` says, in addition, that no (row, col) pair
    repeats and columns increase within a row.
    """

    row: Tensor
    col: Tensor
    values: Tensor
    shape: Tuple[int, int]
    form: str
    is_vector: bool = False
    row_sorted: bool = False
    coalesced: bool = False

    # -- plain facts ---------------------------------------------------------
    @property
    def nnz(self) -> int:
        return self.values.shape[0]

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
        """Number of specified entries of each row, int64 ``(rows,)``."""
        return torch.bincount(self.row, minlength=self.rows)

    def crow_indices(self) -> Tensor:
        """CSR row pointers, int64 ``(rows + 1,)``; needs ``row_sorted``."""
        if not self.row_sorted:
            raise RuntimeError("crow_indices needs a row-sorted batch; call sorted_by_row() first")
        crow = self.row.new_zeros(self.rows + 1)
        torch.cumsum(self.row_counts(), 0, out=crow[1:])
        return crow

    # -- reorderings ----------------------------------------------------------
    def linear_index(self) -> Tensor:
        """``row * width + col``: one int64 key per entry, row-major."""
        return self.row * self.width + self.col

    def sorted_by_row(self) -> "SparseBatch":
        """The same entries grouped by row (stable; a no-op when already so)."""
        if self.row_sorted:
            return self
        order = torch.sort(self.row, stable=True).indices
        return replace(self, row=self.row[order], col=self.col[order],
                       values=self.values[order], row_sorted=True)

    def coalesce(self) -> "SparseBatch":
        """Duplicates summed, entries sorted row-major (differentiable in values)."""
        if self.coalesced:
            return self
        key = self.linear_index()
        unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
        values = self.values.new_zeros(unique.shape[0]).index_add(0, inverse, self.values)
        return replace(self, row=unique // self.width, col=unique % self.width,
                       values=values, row_sorted=True, coalesced=True)

    # -- conversions -----------------------------------------------------------
    def to_coo(self) -> Tensor:
        """A 2-D torch sparse COO tensor ``(rows, width)`` (1-D for a vector)."""
        if self.is_vector:
            return _sparse_coo(self.col.unsqueeze(0), self.values, (self.width,), self.coalesced)
        return _sparse_coo(torch.stack([self.row, self.col]), self.values, self.shape, self.coalesced)

    def to_csr(self) -> Tensor:
        """A 2-D torch sparse CSR tensor ``(rows, width)``, duplicates summed."""
        batch = self.coalesce()
        return _sparse_csr(batch.crow_indices(), batch.col, batch.values, self.shape)

    def with_values(self, values: Tensor, keep: Optional[Tensor] = None) -> Any:
        """Rebuild the caller's form with new ``values`` (``(nnz,)``).

        ``keep`` (bool ``(nnz,)``) drops the entries where it is False.  The
        result has the form, width and row count the batch was made from.
        """
        row, col = self.row, self.col
        if keep is not None:
            row, col, values = row[keep], col[keep], values[keep]
        batch = replace(self, row=row, col=col, values=values)
        if self.form == "coo":
            return batch.to_coo()
        if self.form == "csr":
            return batch.to_csr()
        counts = batch.row_counts().tolist()
        batch = batch.sorted_by_row()
        if self.form == "list":
            return [_sparse_coo(c.unsqueeze(0), v, (self.width,), False)
                    for c, v in zip(batch.col.split(counts), batch.values.split(counts))]
        pairs = _as_pairs(batch)
        if self.form == "pairs":
            return pairs
        return list(pairs.split(counts))


def _as_pairs(batch: SparseBatch) -> Tensor:
    """The ``(nnz, 2)`` pair tensor of a batch, indices cast to the values' dtype."""
    return torch.stack([batch.col.to(batch.dtype), batch.values], dim=1)


def is_sparse_form(x: Any) -> bool:
    """True for a torch sparse tensor or a list/tuple (of sparse rows)."""
    if isinstance(x, Tensor):
        return x.layout != torch.strided
    return isinstance(x, (list, tuple))


def _from_coo(x: Tensor, name: str) -> SparseBatch:
    if x.dense_dim() != 0:
        raise NotImplementedError(
            f"{name}: hybrid sparse tensors are not supported, got dense_dim {x.dense_dim()}")
    if x.sparse_dim() not in (1, 2):
        raise ValueError(f"{name} must be a sparse vector or a 2-D sparse batch, "
                         f"got {x.sparse_dim()} dimensions")
    if x.requires_grad and not x.is_coalesced():
        # Only a coalesced tensor exposes differentiable values (x.values()).
        x = x.coalesce()
    coalesced = x.is_coalesced()
    values = x.values() if (x.requires_grad and coalesced) else x._values()
    index = x._indices()
    if x.sparse_dim() == 1:
        col = index[0]
        check_index_range(col, x.shape[0], f"{name} indices")
        return SparseBatch(torch.zeros_like(col), col, values, (1, x.shape[0]), "coo",
                           is_vector=True, row_sorted=True, coalesced=coalesced)
    row, col = index[0], index[1]
    check_index_range(row, x.shape[0], f"{name} row indices")
    check_index_range(col, x.shape[1], f"{name} column indices")
    return SparseBatch(row, col, values, (x.shape[0], x.shape[1]), "coo",
                       row_sorted=coalesced, coalesced=coalesced)


def _from_csr(x: Tensor, name: str) -> SparseBatch:
    if x.dim() != 2 or x.dense_dim() != 0:
        raise ValueError(f"{name} must be a 2-D sparse CSR batch, got shape {tuple(x.shape)}")
    crow, col = x.crow_indices(), x.col_indices()
    check_index_range(col, x.shape[1], f"{name} column indices")
    counts = crow.diff()
    row = torch.repeat_interleave(torch.arange(x.shape[0], device=crow.device), counts,
                                  output_size=col.shape[0]).to(torch.int64)
    return SparseBatch(row, col.to(torch.int64), x.values(), (x.shape[0], x.shape[1]), "csr",
                       row_sorted=True)


def _from_pairs(x: Tensor, name: str, width: Optional[int]) -> SparseBatch:
    if x.dim() != 2 or x.shape[1] != 2:
        if x.numel() == 0:  # an empty row may come as torch.tensor([])
            x = x.reshape(0, 2)
        else:
            raise ValueError(f"{name} must be a pair tensor of shape (k, 2), "
                             f"got shape {tuple(x.shape)}")
    col = _pair_index(x[:, 0], name)
    check_index_range(col, width, f"{name} indices")
    return SparseBatch(torch.zeros_like(col), col, x[:, 1], (1, width or 0), "pairs",
                       is_vector=True, row_sorted=True)


def _from_list(rows: Sequence[Any], name: str, width: Optional[int]) -> SparseBatch:
    if len(rows) == 0:
        if width is None:
            raise ValueError(f"{name} is an empty list; pass a size to give its width")
        return SparseBatch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                           torch.zeros(0), (0, width), "list", row_sorted=True, coalesced=True)
    for i, r in enumerate(rows):
        if not isinstance(r, Tensor):
            raise TypeError(f"{name}[{i}] must be a tensor, got {type(r).__name__}")
    devices = {r.device for r in rows}
    if len(devices) > 1:
        raise ValueError(f"{name} rows must be on one device, got {sorted(map(str, devices))}")
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
        parts = [_from_pairs(r, f"{name}[{i}]", width) for i, r in enumerate(rows)]
        form, inferred = "pair_list", max(int(p.col.max()) + 1 if p.nnz else 0 for p in parts)
    device = parts[0].device
    counts = torch.tensor([p.nnz for p in parts], device=device)
    col = torch.cat([p.col for p in parts])
    row = torch.repeat_interleave(torch.arange(len(parts), device=device), counts,
                                  output_size=col.shape[0])
    values = torch.cat([p.values for p in parts])
    return SparseBatch(row, col, values, (len(parts), inferred), form, row_sorted=True)


def as_sparse_batch(x: Any, *, name: str = "input", width: Optional[int] = None) -> SparseBatch:
    """Normalise any accepted sparse form to a :class:`SparseBatch`.

    Args:
        x: a sparse COO vector or batch, a sparse CSR batch, a ``(k, 2)`` pair
            tensor, or a list of sparse vectors or of pair tensors.
        name: the argument's name, used in error messages.
        width: the number of columns when the caller knows it; entries must
            lie below it.  Inferred otherwise (a torch tensor's size, or the
            largest pair index + 1).

    Raises:
        TypeError: ``x`` is not one of the accepted forms.
        ValueError: bad shape, negative, non-integer or out-of-range indices,
            rows on different devices.
        NotImplementedError: a hybrid sparse tensor or another sparse layout.
    """
    if isinstance(x, Tensor):
        if x.layout == torch.sparse_coo:
            batch = _from_coo(x, name)
        elif x.layout == torch.sparse_csr:
            batch = _from_csr(x, name)
        elif x.layout == torch.strided:
            batch = _from_pairs(x, name, width)
            if width is None:
                batch = replace(batch, shape=(1, int(batch.col.max()) + 1 if batch.nnz else 0))
        else:
            raise NotImplementedError(
                f"{name}: layout {x.layout} is not supported; convert with .to_sparse_coo() "
                "or .to_sparse_csr()")
    elif isinstance(x, (list, tuple)):
        batch = _from_list(x, name, width)
    else:
        raise TypeError(f"{name} must be a sparse tensor, a pair tensor or a list of sparse "
                        f"rows, got {type(x).__name__}")
    if width is not None and width != batch.width:
        if width < batch.width:
            raise ValueError(f"{name} has width {batch.width}, larger than the size "
                             f"asked for, {width}")
        batch = replace(batch, shape=(batch.rows, width))
    return batch


def resolve_size(given: Optional[Sequence[int]], batch: SparseBatch, name: str = "size") -> Tuple[int, int]:
    """The ``(rows, width)`` a result should have: ``given`` checked against the data."""
    if given is None:
        return batch.shape
    rows, width = given
    if rows < batch.rows:
        raise ValueError(f"{name} must have at least {batch.rows} rows, got {rows}")
    if width < batch.width:
        raise ValueError(f"{name} must have at least {batch.width} columns, got {width}")
    return int(rows), int(width)
