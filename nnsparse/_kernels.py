"""The sparse products every layer is built from, in one place.

A sparse batch ``S`` of shape ``(rows, n)`` is held in coordinate form
(``row``, ``col``, ``values``) with CSR row pointers ``crow`` when its entries
are grouped by row.  Three products cover the forward and backward passes of
the sparse layers:

- ``S @ T`` for a dense table ``T`` of shape ``(n, d)``: :func:`_csr_rows_mm`,
  an ``embedding_bag`` sum, which on CPU measured 2-3x faster than a CSR
  product (``torch.sparse.mm``) at MovieLens shapes;
- ``S.T @ A`` for a dense ``A`` of shape ``(rows, d)``: over every column
  (:func:`_t_mm`, no host sync) or restricted to the columns ``S`` touches
  (``SparseBatch.column_major`` then :func:`_csr_rows_mm`);
- ``(A @ B)`` sampled at ``S``'s positions: :func:`_sampled_mm`
  (``torch.sparse.sampled_addmm``).

A table larger than the CPU's last-level cache is read differently
(:func:`_table_mm`, :func:`_sampled_rows`; the sampled product from a quarter of
it, ``_COLUMN_MAJOR_ABOVE``, as the step's other tables evict it): in row-major
order each entry reads a table row from memory at a random place, and those
reads, not the arithmetic, bound the product.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set, Tuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _index
from ._forms import _sparse_csr, plain

if TYPE_CHECKING:
    from ._forms import SparseBatch
    from ._rowopt import TableUpdate

__all__: List[str] = []


def _csr_rows_mm(index: Tensor, table: Tensor, crow: Tensor, weights: Tensor) -> Tensor:
    """``out[i] = sum(weights[e] * table[index[e]] for e in crow[i]:crow[i+1])``.

    ``table`` must be contiguous ``(n, d)``; the result is ``(len(crow) - 1, d)``
    with zeros for empty bags.
    """
    return _bags_mm(index, table, crow[:-1], weights)


def _bags_mm(index: Tensor, table: Tensor, offsets: Tensor, weights: Tensor) -> Tensor:
    """:func:`_csr_rows_mm` from the bags' first entries ``offsets`` (``crow[:-1]``)."""
    if offsets.shape[0] == 0 or table.shape[1] == 0:
        # (embedding_bag refuses a zero-width table: "Expected i < index_size")
        return table.new_zeros(offsets.shape[0], table.shape[1])
    table, weights = _forward_only(table, weights)
    return F.embedding_bag(index, table, offsets, mode="sum", per_sample_weights=weights)


def _forward_only(table: Tensor, weights: Tensor) -> Tuple[Tensor, Tensor]:
    """``table`` and ``weights`` detached inside the layers' autograd Functions (grad
    mode off): embedding_bag then takes its forward-only kernel (no bag bookkeeping
    for a backward), measured 17% faster at 34,000 entries of width 500."""
    if not torch.is_grad_enabled() and (table.requires_grad or weights.requires_grad):
        return table.detach(), weights.detach()
    return table, weights


class _BagRows:
    """``rows(a, b)``: the bags ``a:b`` of ``_csr_rows_mm(index, table, crow, weights)``.

    Lets a caller make a large product block by block (the in-backward
    optimiser updates the rows of each block before the next is made).  The
    block bounds are read from ``crow`` on the host, so only whole-range
    calls are made on a GPU; :meth:`prefetch` reads the bounds of all the
    blocks a caller will ask for at once (one read instead of two a block)
    and makes every block's bag offsets in one pass (a block's are its
    pointers less its first entry's).
    """

    def __init__(self, index: Tensor, table: Tensor, crow: Tensor, weights: Tensor) -> None:
        self.table, self.weights = _forward_only(table, weights)  # once, not per block
        self.index, self.crow = index, crow
        self.bounds: Dict[int, int] = {}
        self.offsets: Optional[Tensor] = None  # set by prefetch: each block's, from 0
        self._blocks: Set[Tuple[int, int]] = set()  # the blocks prefetch made offsets for

    def prefetch(self, points: List[int]) -> None:
        """Read the bounds of the blocks ``points[i]:points[i + 1]`` (increasing,
        covering the bags from ``points[0]``) and make their offsets."""
        at = torch.tensor(points, device=self.crow.device)
        firsts = self.crow.index_select(0, at)
        self.bounds.update(zip(points, firsts.tolist()))
        sizes = at.diff()
        self.offsets = self.crow.new_empty(self.crow.shape[0] - 1)
        span = self.crow[points[0]:points[-1]]
        torch.sub(span, firsts[:-1].repeat_interleave(sizes, output_size=span.shape[0]),
                  out=self.offsets[points[0]:points[-1]])
        self._blocks = set(zip(points[:-1], points[1:]))

    def _bound(self, i: int) -> int:
        if i not in self.bounds:
            self.bounds[i] = int(self.crow[i])
        return self.bounds[i]

    def __call__(self, a: int, b: int) -> Tensor:
        if a == 0 and b == self.crow.shape[0] - 1:
            return _csr_rows_mm(self.index, self.table, self.crow, self.weights)
        s, e = self._bound(a), self._bound(b)
        if (a, b) in self._blocks:
            assert self.offsets is not None
            offsets = self.offsets[a:b]
        else:
            offsets = self.crow[a:b] - s
        return _bags_mm(self.index[s:e], self.table, offsets, self.weights[s:e])


def _bag_rows(index: Tensor, table: Tensor, crow: Tensor, weights: Tensor) -> _BagRows:
    """A :class:`_BagRows` over these bags."""
    return _BagRows(index, table, crow, weights)


def _t_mm(row: Tensor, col: Tensor, values: Tensor, dense: Tensor, width: int,
          pattern: Optional["SparseBatch"] = None) -> Tensor:
    """``S.T @ dense`` over all ``width`` columns of ``S`` (entries ``row, col, values``).

    One ``embedding_bag`` with a bag per column (empty bags give the zero
    rows): the ``(width, d)`` result is written in one pass, never zero-filled
    and scattered into, and no size is read back (no host sync on CUDA).  The
    transposed structure is ``pattern``'s cached one when given.
    """
    perm, crow_t, row_t = (pattern.column_major_all(width) if pattern is not None
                           else _index.column_major_all(row, col, width))
    return _csr_rows_mm(row_t, dense, crow_t, values.index_select(0, perm))


def _sampled_mm(a: Tensor, b: Tensor, crow: Tensor, col: Tensor) -> Tensor:
    """``(a @ b)[row, col]`` for the CSR positions ``(crow, col)``, shape ``(nnz,)``.

    Positions may repeat and be unsorted within a row: each gets its own value.
    """
    if col.shape[0] == 0:
        return a.new_zeros(0)
    if a.device.type == "meta":
        # torch has no meta kernel of the product for a CSR mask (2.13: "Could not run
        # 'aten::sparse_sampled_addmm' ... 'SparseCsrMeta' backend"): the shape is known
        return a.new_empty(col.shape[0])
    if a.dtype in (torch.float16, torch.bfloat16):
        # torch's sampled product has no half-type kernel (CPU nor CUDA, torch
        # 2.11-2.13): this one product runs in float32, returned in a's dtype
        return _sampled_mm(a.float(), b.float(), crow, col).to(a.dtype)
    if col.shape[0] > a.shape[0] * b.shape[1]:
        # More positions than the product has elements (repeated ones: an uncoalesced
        # batch or a pair row repeating an index, on a narrow product): torch's
        # sampled_addmm refuses such a mask ("torch.copy_: only sparse compressed tensors
        # with the same number of specified elements are supported").  No host sync:
        # the sizes are known.
        return _gather_dot(a, b.t(), _index.rows_from_crow(crow, col.shape[0]), col)
    try:
        # sampled_addmm ignores the mask's values with beta=0, but they must be
        # finite (0 * NaN = NaN), hence zeros rather than empty.
        mask = _sparse_csr(crow, col, a.new_zeros(col.shape[0]), (a.shape[0], b.shape[1]))
    except RuntimeError:
        # inside a torch.func transform (a backward under grad, jacrev's vmap) no
        # CSR tensor can be built: the same product by gathers
        if not _index.in_transform():
            raise
        return _gather_dot(a, b.t(), _index.rows_from_crow(crow, col.shape[0]), col)
    # of plain aliases: a Tensor subclass's __torch_function__ would cast the CSR product
    # to its class, which a sparse tensor cannot take (a dense input or weight of
    # sampled_linear / SparseOutputLinear, or a network fed such data)
    return cast(Tensor, torch.sparse.sampled_addmm(mask, plain(a), plain(b), beta=0.0)).values()


# The gather-and-dot product takes the entries in chunks of this many, bounding
# its (chunk, d) temporaries.
_GATHER_CHUNK = 1 << 16


def _gather_dot(a: Tensor, b_t: Tensor, row: Tensor, col: Tensor) -> Tensor:
    """``(a @ b_t.T)[row, col]``, shape ``(nnz,)``: each entry the dot product of a row
    of ``a`` and one of ``b_t``, gathered in chunks.  For what ``sampled_addmm`` cannot
    take (half types, a ``torch.func`` transform's tensors); out of place, so that
    ``vmap`` can batch it."""
    parts = [(a.index_select(0, row[s:s + _GATHER_CHUNK])
              * b_t.index_select(0, col[s:s + _GATHER_CHUNK])).sum(1)
             for s in range(0, col.shape[0], _GATHER_CHUNK)]
    if not parts:
        return a.new_zeros(0)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# On CPU, a table of more than _BLOCK_ABOVE bytes is read in blocks of about
# _BLOCK_BYTES (a share of a 32 MB last-level cache).  Measured at the
# ML-10M shape (a 69,878 x 500 float32 table, 118,577 entries in 128 rows,
# 1 thread): S @ table 21.0 ms in one embedding_bag, 12.3-14.1 ms in 4-16
# blocks; the sampled product 30.9 ms row-major, 14.3 ms column-major (whose
# threshold is lower: _COLUMN_MAJOR_ABOVE).
_BLOCK_ABOVE = 32 << 20
_BLOCK_BYTES = 8 << 20


def _table_blocks(table: Tensor) -> int:
    """In how many blocks of rows ``S @ table`` reads ``table`` (1: in one pass)."""
    size = table.shape[0] * table.shape[1] * table.element_size()
    if table.device.type != "cpu" or size <= _BLOCK_ABOVE:
        return 1
    return -(-size // _BLOCK_BYTES)


def _table_mm(pattern: Optional["SparseBatch"], col: Tensor, table: Tensor, crow: Tensor,
              weights: Tensor) -> Tensor:
    """``S @ table`` for the row-grouped batch ``(crow, col, weights)`` of ``pattern``.

    :func:`_csr_rows_mm`; for a large CPU table, the entries taken a block of
    columns at a time (``pattern.blocked_order``, cached on the batch), one
    bag per (block, row), and the blocks' partial rows summed: each block of
    the table is read from memory once and then from cache.
    """
    rows = crow.shape[0] - 1
    # the blocks' partial rows, blocks * rows of them, stay under a quarter of the table
    blocks = min(_table_blocks(table), table.shape[0] // max(1, 4 * rows))
    if blocks <= 1 or pattern is None or col.shape[0] == 0:
        return _csr_rows_mm(col, table, crow, weights)
    order, crow_b = pattern.blocked_order(blocks)
    parts = _csr_rows_mm(col.index_select(0, order), table, crow_b,
                         weights.index_select(0, order))
    return parts.view(blocks, rows, table.shape[1]).sum(0)


# The large-weight sampled product takes pointers over every output row (weight
# row) while there are at most _ALL_ROWS_PER_ENTRY of them per entry, and over the
# used rows only beyond (their weight rows gathered, _BLOCK_BYTES at a time), so
# that its index memory is O(nnz) whatever out_features.  Measured on 1 thread,
# 128 rows, every row / used rows: at the ML-10M shape (69,878 x 500, 117,197
# entries) 11.5 / 15.2 ms; at 2 rows per entry (69,878 x 500, 35,000 entries)
# 7.3 / 7.4 ms; beyond, the used rows are faster (2**19 x 128, 100,000 entries:
# 11.9 / 6.6 ms; 2**22 x 4, 100,000 entries: 59.0 / 6.3 ms).  Both give the
# same values, bit for bit.
_ALL_ROWS_PER_ENTRY = 2


# A CPU weight of more than _COLUMN_MAJOR_ABOVE bytes (or a blocked one, over
# _BLOCK_ABOVE) is sampled in column-major order, each used row read once: its rows
# then come from memory in increasing order rather than at random.  Measured in a
# training step at the ML-1M shape (a 6,040 x 500 float32 table, 12 MB: it fits the
# 32 MB last-level cache, but the step's other tables evict it), 1 thread, 128 rows,
# about 33,000 entries: the product 2.6 ms row-major, 1.8 ms column-major with the
# cache flushed, 1.4 / 1.1 ms with it warm; the whole row-wise Adagrad step 5-10 %
# faster (interleaved steps; 3-12 % on 2 threads).  Below, no gain: 3.8 MB, 0.69 /
# 0.72 ms flushed; 1.0 MB, 0.32 / 0.33 ms.  The column-major structure is the one the
# backward sorts for anyway (SparseBatch.column_major_all, cached on the batch).
_COLUMN_MAJOR_ABOVE = 8 << 20


def _sampled_by_column(weight: Tensor) -> bool:
    """Whether :func:`_sampled_rows` samples ``weight`` in column-major order."""
    if weight.device.type != "cpu":
        return False
    size = weight.shape[0] * weight.shape[1] * weight.element_size()
    return size > min(_COLUMN_MAJOR_ABOVE, _BLOCK_ABOVE)


def _sampled_rows(pattern: Optional["SparseBatch"], h: Tensor, weight: Tensor, crow: Tensor,
                  col: Tensor) -> Tensor:
    """``(h @ weight.T)`` at the positions ``(crow, col)`` of ``pattern``, ``(nnz,)``.

    :func:`_sampled_mm`; for a large CPU ``weight`` (:func:`_sampled_by_column`), the
    transposed product ``weight @ h.T`` sampled in column-major order (cached on
    the batch), so that each touched row of ``weight`` is read once, in increasing
    order, and the values put back in the pattern's order.  The column-major pointers cover
    every row of ``weight`` (``pattern.column_major_all``) while ``weight`` has
    at most ``_ALL_ROWS_PER_ENTRY`` rows per entry, else the touched rows only
    (``pattern.column_major``, :func:`_sampled_used_rows`): O(nnz) either way.
    """
    if not _sampled_by_column(weight) or pattern is None or col.shape[0] == 0:
        return _sampled_mm(h, weight.t(), crow, col)
    if weight.shape[0] <= _ALL_ROWS_PER_ENTRY * col.shape[0]:
        perm, crow_all, row_t = pattern.column_major_all(weight.shape[0])
        values_t = _sampled_mm(weight, h.t(), crow_all, row_t)
    else:
        perm, cols, crow_t, row_t = pattern.column_major()
        values_t = _sampled_used_rows(weight, h, cols, crow_t, row_t)
    return torch.empty_like(values_t).index_copy_(0, perm, values_t)


def _sampled_used_rows(weight: Tensor, h: Tensor, cols: Tensor, crow_t: Tensor,
                       row_t: Tensor) -> Tensor:
    """``(weight @ h.T)`` at the transposed positions over the used rows ``cols`` of
    ``weight`` (pointers ``crow_t``, rows of ``h`` ``row_t``), ``(nnz,)`` in that order.

    The used rows of ``weight`` are gathered a block of about ``_BLOCK_BYTES`` at a
    time, each block's product sampled from it: the same dot products as over every
    row, in the same order.  CPU only (the block bounds are read on the host).
    """
    per = max(1, _BLOCK_BYTES // max(1, weight.shape[1] * weight.element_size()))
    used = cols.shape[0]
    if used <= per:
        return _sampled_mm(weight.index_select(0, cols), h.t(), crow_t, row_t)
    starts = list(range(0, used, per)) + [used]
    bounds = crow_t.index_select(0, torch.tensor(starts, device=crow_t.device)).tolist()
    return torch.cat([
        _sampled_mm(weight.index_select(0, cols[a:b]), h.t(), crow_t[a:b + 1] - s,
                    row_t[s:e])
        for a, b, s, e in zip(starts[:-1], starts[1:], bounds[:-1], bounds[1:])])


# Devices where the optimiser in the backward takes its synchronisation-free
# step (TableUpdate.masked): counting the distinct touched rows, which the
# lazy row update needs, is a host synchronisation on a GPU.
_SYNC_FREE = ("cuda",)


def _update_rows_of(update: "TableUpdate", table: Tensor, pattern: "SparseBatch",
                    dense: Tensor, entry_values: Tensor) -> None:
    """The in-backward step of ``table`` from its gradient ``S.T @ dense``, ``S`` the
    entries of ``pattern`` with the values ``entry_values`` (its columns index the
    rows of ``table``; its cached transposed structures are read).

    On CPU, the touched rows are updated from their gradient rows, made block by
    block (``update``'s ``__call__``); on a GPU, every row from a gradient with
    zero rows where untouched, and nothing is read back (``update.masked``).

    On CPU the touched rows come from ``pattern.column_major`` (O(nnz)); the
    pointers over every table row (``pattern.column_major_all`` over the
    pattern's own width, derived from the same sort) are made only if the step
    is the dense one (more than ``dense_above`` of the rows touched), so a
    lazy step on a huge table allocates nothing of the table's height.  A GPU
    reads them always.  A pattern narrower than the table (the layers widen
    theirs to the table; a direct caller may not) gets the same pointers with
    the table's extra rows appended, empty (``nnz`` each), instead of a second
    sort of its entries; the sizes are known, so no host sync.
    """
    extra = table.shape[0] - pattern.width
    if extra < 0:
        raise ValueError(f"pattern has width {pattern.width}, more than the table's "
                         f"{table.shape[0]} rows")

    def every_row() -> Tensor:  # (table rows + 1,) pointers
        crow_all = pattern.column_major_all(pattern.width)[1]
        return torch.cat([crow_all, crow_all[-1:].expand(extra)]) if extra else crow_all
    if table.device.type in _SYNC_FREE:
        perm, _, row_t = pattern.column_major_all(pattern.width)
        crow_all = every_row()
        weights = entry_values.index_select(0, perm)
        update.masked(table, crow_all.diff() > 0, _csr_rows_mm(row_t, dense, crow_all, weights))
        return
    perm, cols, crow_t, row_t = pattern.column_major()
    weights = entry_values.index_select(0, perm)
    update(table, cols, _bag_rows(row_t, dense, crow_t, weights),
           _LazyBagRows(lambda: _bag_rows(row_t, dense, every_row(), weights)))


def _update_every_row(update: "TableUpdate", table: Tensor, grad: Tensor,
                      touched: bool) -> None:
    """The in-backward step of ``table`` from its dense gradient ``grad`` (``table``'s
    shape) where a dense input touched every row (``touched``; none for an input of no
    rows, whose gradient is then zero): the step :func:`_update_rows_of` takes for a
    batch holding every entry explicitly, through the same machinery (``update``'s
    ``__call__`` with every row, the dense step above ``dense_above`` given the same
    gradient).  On every device: the rows touched are known on the host (all or none),
    so a GPU reads nothing back here either (one block, every row: the kernel over the
    table), and needs none of ``update.masked``'s copies of the table and its state,
    which would restore no row."""
    rows = torch.arange(table.shape[0] if touched else 0, device=table.device)
    update(table, rows, grad[:rows.shape[0]], lambda a, b: grad[a:b])


class _LazyBagRows:
    """A :class:`_BagRows` made on first use (a call or :meth:`prefetch`): the dense
    step's product over every table row, whose pointers a lazy step never needs."""

    def __init__(self, make: Callable[[], _BagRows]) -> None:
        self._make: Optional[Callable[[], _BagRows]] = make
        self._rows: Optional[_BagRows] = None

    def _made(self) -> _BagRows:
        if self._rows is None:
            assert self._make is not None  # set until the first use
            self._rows, self._make = self._make(), None
        return self._rows

    def prefetch(self, points: List[int]) -> None:
        self._made().prefetch(points)

    def __call__(self, a: int, b: int) -> Tensor:
        return self._made()(a, b)
