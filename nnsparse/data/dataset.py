"""A ``torch.utils.data`` path for sparse rows: a dataset and its collate function.

The dataset hands out plain ``(indices, values)`` tensors; :meth:`SparseRowDataset.collate`
joins a list of them into one CSR (or COO) batch.  With ``num_workers > 0`` the
collated batch travels between processes as plain tensors too (see
:class:`SparseRowBatch`), and the sparse tensors are rebuilt in the main
process, so ``DataLoader(num_workers=..., pin_memory=True)`` works unchanged.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .._forms import _sparse_coo, _sparse_csr

__all__ = ["SparseRowDataset", "SparseRowBatch", "collate_sparse_rows"]

Row = Tuple[Tensor, Tensor]  # (column indices, values) of one row


def _as_csr(matrix: Tensor, name: str) -> Tuple[Tensor, Tensor, Tensor]:
    """``(crow, col, values)`` of a 2-D sparse COO or CSR matrix, on the CPU."""
    if not isinstance(matrix, Tensor) or matrix.layout not in (torch.sparse_csr, torch.sparse_coo):
        got = type(matrix).__name__ if not isinstance(matrix, Tensor) else f"layout {matrix.layout}"
        raise TypeError(f"{name} must be a 2-D sparse CSR or COO tensor, got {got}")
    if matrix.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, width), got shape {tuple(matrix.shape)}")
    if matrix.layout == torch.sparse_coo:
        matrix = matrix.coalesce().to_sparse_csr()
    # A DataLoader reads on the CPU; the batch moves to the device in the loop.
    return (matrix.crow_indices().cpu(), matrix.col_indices().cpu().to(torch.int64),
            matrix.values().detach().cpu())


class SparseRowBatch(NamedTuple):
    """One batch of rows: ``(row_index, input, target)``.

    Attributes:
        row_index (Tensor): int64 ``(batch,)``, the matrix row of each batch row
            (to pick row means, masks or outputs that belong to it).
        input (Tensor): sparse ``(batch, width)`` CSR (or COO) rows of the
            first matrix.
        target (Tensor or None): the same rows of the second matrix, when the
            dataset has one.

    Between processes the batch is pickled as plain tensors and rebuilt, so
    the sparse tensors never go through torch's sparse reductions.
    """

    row_index: Tensor
    input: Tensor
    target: Optional[Tensor] = None

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _rebuild_batch, (self.row_index, _parts(self.input), _parts(self.target))

    def to(self, device: Any, non_blocking: bool = False) -> "SparseRowBatch":
        """The batch on ``device`` (each tensor moved with ``non_blocking``)."""
        move = (lambda t: None if t is None else t.to(device, non_blocking=non_blocking))
        return SparseRowBatch(move(self.row_index), move(self.input), move(self.target))


def _parts(x: Optional[Tensor]) -> Optional[Tuple[str, Tuple[Tensor, ...], Tuple[int, int]]]:
    if x is None:
        return None
    if x.layout == torch.sparse_csr:
        return "csr", (x.crow_indices(), x.col_indices(), x.values()), tuple(x.shape)
    return "coo", (x._indices(), x._values()), tuple(x.shape)


def _build(parts: Optional[Tuple[str, Tuple[Tensor, ...], Tuple[int, int]]]) -> Optional[Tensor]:
    if parts is None:
        return None
    layout, tensors, shape = parts
    if layout == "csr":
        return _sparse_csr(*tensors, shape)
    return _sparse_coo(*tensors, shape, coalesced=True)


def _rebuild_batch(row_index: Tensor, input: Any, target: Any) -> SparseRowBatch:
    return SparseRowBatch(row_index, _build(input), _build(target))


def collate_sparse_rows(rows: Sequence[Tuple[int, Row]], width: int,
                        layout: torch.layout = torch.sparse_csr) -> Tuple[Tensor, Tensor]:
    r"""Join sparse rows into one batch.

    Args:
        rows: a sequence of ``(row_index, (indices, values))``: int64 column
            ``indices`` sorted and unique within the row, ``values`` of one
            dtype; rows may be empty.
        width (int): the number of columns.
        layout (torch.layout): ``torch.sparse_csr`` (default) or ``torch.sparse_coo``.

    Returns:
        ``(index, batch)``: int64 ``(len(rows),)`` row indices and a coalesced
        sparse ``(len(rows), width)`` batch.  Every given entry is specified,
        zeros included.

    Example::

        >>> rows = [(4, (torch.tensor([0, 2]), torch.tensor([1., 0.]))),
        ...         (7, (torch.tensor([], dtype=torch.long), torch.tensor([])))]
        >>> index, batch = collate_sparse_rows(rows, width=3)
        >>> index, batch.crow_indices(), batch.col_indices(), batch.values()
        (tensor([4, 7]), tensor([0, 2, 2]), tensor([0, 2]), tensor([1., 0.]))
    """
    if layout not in (torch.sparse_csr, torch.sparse_coo):
        raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
    index = torch.tensor([r[0] for r in rows], dtype=torch.int64)
    cols = [r[1][0] for r in rows]
    values = torch.cat([r[1][1] for r in rows]) if rows else torch.zeros(0)
    col = torch.cat(cols) if rows else torch.zeros(0, dtype=torch.int64)
    counts = torch.tensor([c.shape[0] for c in cols], dtype=torch.int64)
    if col.numel() and int(col.max()) >= width:
        raise ValueError(f"rows indices must be in [0, {width}), got max {int(col.max())}")
    if layout == torch.sparse_coo:
        row = torch.repeat_interleave(torch.arange(len(rows)), counts, output_size=col.shape[0])
        return index, _sparse_coo(torch.stack([row, col]), values, (len(rows), width), True)
    crow = counts.new_zeros(len(rows) + 1)
    torch.cumsum(counts, 0, out=crow[1:])
    return index, _sparse_csr(crow, col, values, (len(rows), width))


class SparseRowDataset(Dataset):
    r"""The rows of a sparse matrix (and, optionally, of a target matrix) as a dataset.

    Item ``i`` is ``(i, (indices, values))``, or ``(i, (indices, values),
    (target_indices, target_values))`` with a target: plain CPU tensors,
    which every ``DataLoader`` can pass between processes.  Use
    :meth:`collate` as the loader's ``collate_fn`` to get
    :class:`SparseRowBatch` batches.

    The usual pairs for an autoencoder on ratings:

    * training: ``SparseRowDataset(train_matrix)`` (input = target);
    * evaluation: ``SparseRowDataset(train_matrix, test_matrix)``: the
      training ratings as input, the held-out ratings as target.

    Args:
        input (Tensor): sparse CSR or COO ``(rows, width)``.
        target (Tensor, optional): sparse ``(rows, target_width)``, the same
            number of rows.
        layout (torch.layout): the layout of collated batches,
            ``torch.sparse_csr`` (default) or ``torch.sparse_coo``.

    Raises:
        TypeError: a matrix that is not sparse COO or CSR, or a bad ``layout``.
        ValueError: a matrix that is not 2-D, or matrices with different row counts.

    Example::

        >>> from torch.utils.data import DataLoader
        >>> x = torch.tensor([[1., 0., 2.], [0., 0., 0.], [0., 3., 0.]]).to_sparse_csr()
        >>> ds = SparseRowDataset(x)
        >>> ds[0]
        (0, (tensor([0, 2]), tensor([1., 2.])))
        >>> loader = DataLoader(ds, batch_size=2, collate_fn=ds.collate)
        >>> index, batch, target = next(iter(loader))
        >>> index, batch.crow_indices(), batch.col_indices(), target is None
        (tensor([0, 1]), tensor([0, 2, 2]), tensor([0, 2]), True)
    """

    def __init__(self, input: Tensor, target: Optional[Tensor] = None,
                 layout: torch.layout = torch.sparse_csr) -> None:
        if layout not in (torch.sparse_csr, torch.sparse_coo):
            raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
        self.layout = layout
        self._input = _as_csr(input, "input")
        self.width = input.shape[1]
        self.rows = input.shape[0]
        self._target = None
        self.target_width: Optional[int] = None
        if target is not None:
            self._target = _as_csr(target, "target")
            if target.shape[0] != self.rows:
                raise ValueError(f"target must have {self.rows} rows like input, "
                                 f"got {target.shape[0]}")
            self.target_width = target.shape[1]
        # Python ints: slicing with them is much cheaper than with 0-dim tensors.
        self._bounds = [self._input[0].tolist()]
        if self._target is not None:
            self._bounds.append(self._target[0].tolist())

    def __len__(self) -> int:
        return self.rows

    def _row(self, k: int, i: int) -> Row:
        parts = self._input if k == 0 else self._target
        begin, end = self._bounds[k][i], self._bounds[k][i + 1]
        return parts[1][begin:end], parts[2][begin:end]

    def __getitem__(self, i: int) -> Tuple[Any, ...]:
        if not -self.rows <= i < self.rows:
            raise IndexError(f"index must be in [-{self.rows}, {self.rows}), got {i}")
        i = int(i) % self.rows
        if self._target is None:
            return i, self._row(0, i)
        return i, self._row(0, i), self._row(1, i)

    def collate(self, items: List[Tuple[Any, ...]]) -> SparseRowBatch:
        """``collate_fn`` for a ``DataLoader``: a list of items -> one :class:`SparseRowBatch`."""
        index, input = collate_sparse_rows([(it[0], it[1]) for it in items], self.width,
                                           self.layout)
        if self._target is None:
            return SparseRowBatch(index, input)
        _, target = collate_sparse_rows([(it[0], it[2]) for it in items],
                                        self.target_width, self.layout)
        return SparseRowBatch(index, input, target)
