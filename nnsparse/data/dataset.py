"""A ``torch.utils.data`` path for sparse rows: a dataset and its collate function.

The dataset hands out :class:`SparseRow` items (``(indices, values)`` plain
tensors); :meth:`SparseRowDataset.collate` joins a list of them into one CSR
(or COO) batch, trusted (its structure attached, never checked again).  With
``num_workers > 0`` the collated batch travels between processes as plain
tensors (see :class:`SparseRowBatch`) and is rebuilt, trusted, in the main
process, so ``DataLoader(num_workers=..., pin_memory=True)`` works unchanged.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple, cast

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .._forms import (SparseBatch, _a, _attached, _check_csr, _version, as_device, as_int,
                      as_sparse_batch, check_int64, int_dtype, is_int, move_structure, plain,
                      refuse_meta, scipy_sparse_hint, trust)
from .._index import coo_tensor, crow_from_counts, csr_tensor, rows_from_crow
from .readers import Ratings

__all__ = ["SparseRowDataset", "SparseRowBatch", "SparseRow", "collate_sparse_rows"]

_Row = Tuple[Tensor, Tensor]  # (column indices, values) of one row


# A numpy target (scikit-learn's y) is most often one label per row (a class, a click), which
# sparsify would lose wherever it is 0: a dense tensor target holds such labels as they are.
_DENSE_TARGET_HINT = ("; dense labels (a class or a click per row, or a dense vector per row) "
                      "are a dense tensor target: torch.from_numpy(y); a dense matrix whose "
                      "zeros are missing entries becomes sparse with "
                      "nnsparse.sparsify(torch.from_numpy(x), layout=torch.sparse_csr)")
#: what a target may be, for the messages
_TARGET_FORMS = "a 2-D sparse CSR or COO tensor or a dense tensor of labels"


def _as_csr(matrix: Tensor, name: str) -> Tuple[Tensor, Tensor, Tensor]:
    """``(crow, col, values)`` of a 2-D sparse COO or CSR matrix, checked, on the CPU.

    The matrix is validated completely here (indices in range, CSR row
    pointers, columns increasing within each row), once: the rows handed
    out later need no check.
    """
    if not isinstance(matrix, Tensor) or matrix.layout not in (torch.sparse_csr, torch.sparse_coo):
        got = type(matrix).__name__ if not isinstance(matrix, Tensor) else f"layout {matrix.layout}"
        # a dense matrix is the first thing a user has: say how to make it sparse
        dense = isinstance(matrix, Tensor) and matrix.layout == torch.strided
        numpy = type(matrix).__module__ == "numpy"
        hint = (_DENSE_TARGET_HINT if name == "target" and numpy else
                "; convert a dense matrix with nnsparse.sparsify(x, layout=torch.sparse_csr) "
                "(its zeros left out)" if dense else
                "; a numpy array goes through torch.from_numpy(a), then nnsparse.sparsify"
                if numpy else
                # rating triples are the second thing: their matrix is one call away
                "; ratings become a matrix with RatingNormalizer(train).matrix(ratings) "
                "(normalised, as the models train) or rating_matrix(ratings) (the ratings "
                "as they are), both in nnsparse.data" if isinstance(matrix, Ratings)
                else scipy_sparse_hint(matrix, name))
        forms = _TARGET_FORMS if name == "target" else "a 2-D sparse CSR or COO tensor"
        raise TypeError(f"{name} must be {forms}, got {got}{hint}")
    if matrix.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, width), got shape {tuple(matrix.shape)}")
    batch = as_sparse_batch(matrix, name=name).coalesce()  # duplicates summed, as torch does
    # A DataLoader reads on the CPU; the batch moves to the device in the loop.
    return (batch.crow_indices().cpu(), batch.col.cpu(), batch.values.detach().cpu())


def _as_labels(target: Tensor, rows: int) -> Tensor:
    """A dense ``target``: ``(rows,)`` or ``(rows, k)`` labels, detached, on the CPU."""
    if target.is_nested:  # (strided to its layout, but its .shape raised torch's internal error)
        raise TypeError(f"target must be {_TARGET_FORMS}, got a nested tensor; pad it "
                        f"(torch.nested.to_padded_tensor) for labels of one shape a row")
    refuse_meta(target, "target")
    if target.dim() not in (1, 2):
        raise ValueError(f"target must be 1-D (rows,) or 2-D (rows, k) as dense labels, "
                         f"got shape {tuple(target.shape)}")
    if target.shape[0] != rows:
        raise ValueError(f"target must have {rows} rows like input, got {target.shape[0]}")
    # A DataLoader reads on the CPU, as the sparse matrices' parts
    return plain(target.detach()).cpu()


class _RowType(type):
    # torch's default_collate names the item's type in its error: make that
    # name say how to collate these items.
    def __repr__(cls) -> str:
        return ("nnsparse.data.SparseRow (a SparseRowDataset item: give the DataLoader "
                "collate_fn=ds.collate)")


class SparseRow(metaclass=_RowType):
    """One row of a :class:`SparseRowDataset`: ``(indices, values)``.

    Unpacks as ``indices, values = row``.  torch's default collate function
    cannot join rows of different lengths; a ``DataLoader`` over the dataset
    needs ``collate_fn=ds.collate`` (the error says so).

    Attributes:
        indices (Tensor): int64 ``(k,)`` column indices, increasing.
        values (Tensor): ``(k,)`` the values at those columns.
    """

    __slots__ = ("indices", "values")

    def __init__(self, indices: Tensor, values: Tensor) -> None:
        self.indices, self.values = indices, values

    def __iter__(self) -> Iterator[Tensor]:
        return iter((self.indices, self.values))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Tensor:
        return (self.indices, self.values)[i]

    def __repr__(self) -> str:
        return f"SparseRow(indices={self.indices!r}, values={self.values!r})"

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return SparseRow, (self.indices, self.values)


# (layout, index and value tensors, shape, whether the tensor was checked or trusted,
# and for COO its is_coalesced()); a COO pickle of an older version has no coalesced,
# which a checked batch then implied (collate's)
_Parts = Optional[Tuple[Any, ...]]


def _check_batch_shapes(input: Tensor, target: Optional[Tensor], row_index: Tensor) -> None:
    """One matrix row index per input row, a target of as many rows (shapes only: no sync)."""
    if input.dim() != 2:
        raise ValueError(f"input must be a 2-D (batch, width) batch, got shape {tuple(input.shape)}")
    if row_index.layout != torch.strided:
        raise TypeError(f"row_index must be a dense tensor of matrix rows, got layout "
                        f"{row_index.layout}")
    refuse_meta(row_index, "row_index")
    if row_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"row_index must be an int64 tensor of matrix rows, got {row_index.dtype}")
    if row_index.shape != (input.shape[0],):
        raise ValueError(f"row_index must hold one matrix row per input row, shape "
                         f"({input.shape[0]},), got {tuple(row_index.shape)}")
    if target is not None:
        dense = target.layout == torch.strided  # dense labels: (batch,) or (batch, k)
        if target.dim() not in ((1, 2) if dense else (2,)) or target.shape[0] != input.shape[0]:
            raise ValueError(f"target must be a {'1-D or 2-D dense' if dense else '2-D'} batch "
                             f"of the input's {input.shape[0]} rows, got shape "
                             f"{tuple(target.shape)}")
    for name, t in (("row_index", row_index), ("target", target)):
        if t is not None and t.device != input.device:  # (.to() moves the three together)
            raise ValueError(f"{name} must be on the input's device {input.device}, "
                             f"got {t.device}")


class SparseRowBatch:
    """One batch of rows; unpacks as ``(input, target)`` like a ``TensorDataset`` batch.

    ``x, y = batch`` gives the input and target batches; the row indices and
    the other fields are attributes.

    Attributes:
        input (Tensor): sparse ``(batch, width)`` CSR (or COO) rows of the
            first matrix, trusted.
        target (Tensor or None): the same rows of the second matrix, when the
            dataset has one (``None`` otherwise: an autoencoder's target is
            its input); for a dataset of dense labels, their rows stacked,
            dense ``(batch,)`` or ``(batch, k)``.
        row_index (Tensor): int64 ``(batch,)``, the matrix row of each batch row
            (to pick row means, masks or outputs that belong to it).

    Between processes the batch is pickled as plain tensors and rebuilt
    trusted, so the sparse tensors never go through torch's sparse reductions.
    :meth:`to` and :meth:`pin_memory` keep the batches' checked structure.

    Raises:
        TypeError: a field that is not a tensor, a float ``row_index``.
        ValueError: an input that is not 2-D, a ``row_index`` or ``target``
            whose rows or device are not the input's.

    Example::

        >>> from nnsparse.data import SparseRowDataset
        >>> ds = SparseRowDataset(torch.tensor([[0., 4.], [5., 0.], [1., 2.]]).to_sparse_csr())
        >>> batch = ds.collate([ds[0], ds[2]])
        >>> x, y = batch                     # an autoencoder's target is its input: None
        >>> x.layout, tuple(x.shape), y, batch.row_index
        (torch.sparse_csr, (2, 2), None, tensor([0, 2]))
    """

    __slots__ = ("input", "target", "row_index")

    def __init__(self, input: Tensor, target: Optional[Tensor], row_index: Tensor) -> None:
        for name, value in (("input", input), ("target", target), ("row_index", row_index)):
            if not isinstance(value, Tensor) and not (name == "target" and value is None):
                raise TypeError(f"{name} must be a Tensor{' or None' if name == 'target' else ''}, "
                                f"got {type(value).__name__}")
        _check_batch_shapes(input, target, row_index)
        self.input, self.target, self.row_index = input, target, row_index

    def __iter__(self) -> Iterator[Optional[Tensor]]:
        return iter((self.input, self.target))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Optional[Tensor]:
        return (self.input, self.target)[i]

    def __repr__(self) -> str:
        return (f"SparseRowBatch(input={self.input!r}, target={self.target!r}, "
                f"row_index={self.row_index!r})")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _rebuild_batch, (_parts(self.input), _parts(self.target), self.row_index)

    def _map(self, move: Any) -> "SparseRowBatch":
        def sparse(t: Optional[Tensor]) -> Optional[Tensor]:
            return None if t is None else move_structure(t, move(t))
        return SparseRowBatch(move_structure(self.input, move(self.input)), sparse(self.target),
                              move(self.row_index))

    def to(self, device: Any, non_blocking: bool = False) -> "SparseRowBatch":
        """The batch on ``device`` (each tensor moved with ``non_blocking``), still trusted."""
        device = as_device(device, none=True)  # None: where it is, as Tensor.to(None)
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "SparseRowBatch":
        """The batch in pinned memory (``DataLoader(pin_memory=True)`` calls this)."""
        return self._map(lambda t: t.pin_memory())


def _parts(x: Optional[Tensor]) -> _Parts:
    if x is None:
        return None
    if x.layout == torch.strided:  # dense labels: nothing to check or trust
        return "dense", x
    # a batch collate made is trusted; one built by hand from unchecked tensors is not, and
    # must not become trusted by a trip through pickle (a DataLoader worker's)
    checked = _attached(x) is not None
    if x.layout == torch.sparse_csr:
        return "csr", (x.crow_indices(), x.col_indices(), x.values()), tuple(x.shape), checked
    # the tensor's own claim: a checked COO batch need not be coalesced (a user's, checked
    # at its first use), and must not come back marked so
    return "coo", (x._indices(), x._values()), tuple(x.shape), checked, x.is_coalesced()


def _build(parts: _Parts) -> Optional[Tensor]:
    if parts is None:
        return None
    if parts[0] == "dense":
        return cast(Tensor, parts[1])
    layout, tensors, shape, checked = parts[:4]
    if layout == "csr":
        out = csr_tensor(tensors[0], tensors[1], tensors[2], shape)
    else:
        coalesced = bool(parts[4]) if len(parts) > 4 else bool(checked)
        out = coo_tensor(tensors[0], tensors[1], shape, coalesced=coalesced)
    # the parts of a batch collate built (and checked) in a worker; others checked at use
    return trust(out) if checked else out


def _rebuild_batch(input: _Parts, target: _Parts, row_index: Tensor) -> SparseRowBatch:
    built = _build(input)
    assert built is not None  # a batch always has an input
    return SparseRowBatch(built, _build(target), row_index)


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for a message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_rows(rows: Sequence[Tuple[int, _Row]], width: int) -> None:
    """Every row: tensors, equal lengths, integer columns in range, increasing."""
    for k, item in enumerate(rows):
        try:
            index, (col, val) = item
        except (TypeError, ValueError):
            raise TypeError(f"rows[{k}] must be (row_index, (indices, values)), "
                            f"got {type(item).__name__} {_short(item)}") from None
        for part, what in ((index, "row_index"), (col, "indices"), (val, "values")):
            if isinstance(part, Tensor):
                refuse_meta(part, f"rows[{k}] {what}")
                if part.layout != torch.strided:
                    raise TypeError(f"rows[{k}] {what} must be a dense tensor, got layout "
                                    f"{part.layout}")
        if isinstance(index, Tensor) and (index.dim() != 0 or not int_dtype(index.dtype)):
            raise TypeError(f"rows[{k}] row_index must be an int or a 0-d integer tensor, got "
                            f"{_a(str(index.dtype))} tensor of shape {tuple(index.shape)}")
        if not (is_int(index) or isinstance(index, Tensor)):  # (not a numpy timedelta64)
            raise TypeError(f"rows[{k}] row_index must be an int, got {type(index).__name__}")
        if int(index) < 0:  # a matrix row: negative would pick one from the end
            raise ValueError(f"rows[{k}] row_index must be a non-negative matrix row, "
                             f"got {int(index)}")
        check_int64(int(index), f"rows[{k}] row_index", "a matrix row")
        if not isinstance(col, Tensor) or not isinstance(val, Tensor):
            raise TypeError(f"rows[{k}] indices and values must be tensors, got "
                            f"{type(col).__name__} and {type(val).__name__}")
        if col.dim() != 1 or val.dim() != 1 or col.shape[0] != val.shape[0]:
            raise ValueError(f"rows[{k}] must have one value per index (1-D, equal lengths), "
                             f"got indices of shape {tuple(col.shape)} and values of shape "
                             f"{tuple(val.shape)}")
        if not int_dtype(col.dtype):
            raise TypeError(f"rows[{k}] indices must be an integer tensor, got {col.dtype}")
    if not rows:
        return
    # one batch: torch.cat would promote mixed values (float32 and float64 rows made a float64
    # batch), and fail on mixed devices; an empty row's dtype is not the data's
    dtypes = {r[1][1].dtype for r in rows if r[1][1].numel()}
    if len(dtypes) > 1:
        raise TypeError(f"rows values must share one dtype, got {sorted(map(str, dtypes))}")
    devices = {t.device for r in rows for t in r[1]}
    if len(devices) > 1:
        raise ValueError(f"rows indices and values must be on one device, got "
                         f"{sorted(map(str, devices))}")
    col = torch.cat([r[1][0].to(torch.int64) for r in rows])
    if col.numel() == 0:
        return
    lo, hi = int(col.min()), int(col.max())
    if lo < 0:
        raise ValueError(f"rows indices must be non-negative, got min {lo}")
    if hi >= width:
        raise ValueError(f"rows indices must be in [0, {width}), got max {hi}")
    for k, r in enumerate(rows):
        c = r[1][0]
        if c.shape[0] > 1 and not bool((c[1:] > c[:-1]).all()):
            raise ValueError(f"rows[{k}] indices must be increasing and unique within the row, "
                             f"got {c.tolist()[:10]}")


def _collate(rows: Sequence[Tuple[int, _Row]], width: int,
             layout: torch.layout) -> Tuple[Tensor, Tensor]:
    """``collate_sparse_rows`` on rows known to be valid: a trusted batch."""
    n = len(rows)
    # (device="cpu": whatever torch's default device, torch.set_default_device("cuda"))
    index = torch.tensor([r[0] for r in rows], dtype=torch.int64, device="cpu")
    cols = [r[1][0] for r in rows]
    col = torch.cat(cols).to(torch.int64) if n else torch.zeros(0, dtype=torch.int64, device="cpu")
    vals = [r[1][1] for r in rows]
    # an empty row's dtype is not the data's (torch.tensor([]) is float32 whatever the rows),
    # and torch.cat promotes to it: joined without the empty rows, the batch keeps the dtype
    # and the exact values of the rows with entries (an int64 2**60 + 1 went through float64)
    full = [v for v in vals if v.numel()]
    values = torch.cat(full or vals) if n else torch.zeros(0, device="cpu")
    crow = crow_from_counts(torch.tensor([c.shape[0] for c in cols], dtype=torch.int64,
                                         device="cpu"))
    batch = SparseBatch(rows_from_crow(crow, col.shape[0]), col, values, (n, width), "csr",
                        row_sorted=True, coalesced=True, trusted=True)
    batch.cache.crow = crow
    return index, (batch.to_csr() if layout == torch.sparse_csr else batch.to_coo())


def collate_sparse_rows(rows: Sequence[Tuple[int, _Row]], width: int,
                        layout: torch.layout = torch.sparse_csr) -> Tuple[Tensor, Tensor]:
    r"""Join sparse rows into one batch.

    Args:
        rows: a sequence of ``(row_index, (indices, values))``: integer column
            ``indices`` increasing (sorted, unique) within the row, ``values``
            of one dtype and the same length; rows may be empty.
        width (int): the number of columns.
        layout (torch.layout): ``torch.sparse_csr`` (default) or ``torch.sparse_coo``.

    Returns:
        ``(index, batch)``: int64 ``(len(rows),)`` row indices and a coalesced
        sparse ``(len(rows), width)`` batch, trusted.  Every given entry is
        specified, zeros included.

    Raises:
        TypeError: a bad ``layout``, a row that is not two tensors, float indices,
            rows whose values (empty rows aside) differ in dtype,
            a ``row_index`` that is not an int (or a 0-d integer tensor).
        ValueError: a negative ``width`` or one beyond int64, tensors on more than one
            device, indices out of ``[0, width)``,
            unsorted or repeated within a row, an index/value length mismatch, a
            negative ``row_index``.

    Example::

        >>> rows = [(4, (torch.tensor([0, 2]), torch.tensor([1., 0.]))),
        ...         (7, (torch.tensor([], dtype=torch.long), torch.tensor([])))]
        >>> index, batch = collate_sparse_rows(rows, width=3)
        >>> index, batch.crow_indices(), batch.col_indices(), batch.values()
        (tensor([4, 7]), tensor([0, 2, 2]), tensor([0, 2]), tensor([1., 0.]))
    """
    if layout not in (torch.sparse_csr, torch.sparse_coo):
        raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
    width = as_int(width, "width")  # numpy ints and 0-d integer tensors pass, as for sizes
    if width < 0:
        raise ValueError(f"width must be non-negative, got {width}")
    if not isinstance(rows, (list, tuple)):
        raise TypeError(f"rows must be a list of (row_index, (indices, values)) pairs, "
                        f"got {type(rows).__name__}")
    _check_rows(rows, width)
    return _collate(rows, width, layout)


def _item_form(item: Any) -> Optional[str]:
    """The kind of target of a :class:`SparseRowDataset` item: ``"none"`` for ``(i, row)``,
    ``"sparse"`` for ``(i, row, target_row)``, ``"dense"`` for ``(i, row, labels)``; ``None``
    for anything else."""
    if not (isinstance(item, (tuple, list)) and len(item) in (2, 3)
            and type(item[1]) is SparseRow):
        return None
    if len(item) == 2:
        return "none"
    return "sparse" if type(item[2]) is SparseRow else \
        "dense" if isinstance(item[2], Tensor) else None


def _item_kind(item: Any) -> str:
    """What a collated item is, for a message: ``tuple (int, SparseRow, SparseRow)``."""
    if isinstance(item, (tuple, list)):
        return f"{type(item).__name__} ({', '.join(type(f).__name__ for f in item)})"
    return type(item).__name__


_OTHER = "; collate it with the dataset it came from"
#: what an item of another kind of dataset means: (this dataset's target, the item's)
_TARGET_HINT = {("none", "sparse"): ": an item with a target, which this dataset (built "
                                    "without one) would drop" + _OTHER,
                ("sparse", "none"): ": an item without a target, which this dataset's "
                                    "batches need" + _OTHER,
                ("sparse", "dense"): ": an item with dense labels as its target, where this "
                                     "dataset's target is a sparse matrix" + _OTHER,
                ("dense", "sparse"): ": an item with a sparse target row, where this "
                                     "dataset's target is dense labels" + _OTHER}
_TARGET_HINT["none", "dense"] = _TARGET_HINT["none", "sparse"]
_TARGET_HINT["dense", "none"] = _TARGET_HINT["sparse", "none"]


class SparseRowDataset(Dataset[Tuple[Any, ...]]):
    r"""The rows of a sparse matrix (and, optionally, of a target) as a dataset.

    Item ``i`` is ``(i, row)``, or ``(i, row, target_row)`` with a sparse
    target, each row a :class:`SparseRow` (``indices, values = row``), or
    ``(i, row, target[i])`` with dense labels: plain CPU tensors, which every
    ``DataLoader`` can pass between processes.  Use
    :meth:`collate` as the loader's ``collate_fn`` to get
    :class:`SparseRowBatch` batches (``x, y = batch``); torch's default
    collate cannot join rows of different lengths, and its error says to.

    The matrices are checked completely when the dataset is built (indices in
    range, valid CSR row pointers, columns increasing within each row; an
    uncoalesced COO matrix has its duplicates summed), so the collated
    batches are trusted and never checked again.

    The usual pairs for an autoencoder on ratings:

    * training: ``SparseRowDataset(train_matrix)`` (input = target);
    * evaluation: ``SparseRowDataset(train_matrix, test_matrix)``: the
      training ratings as input, the held-out ratings as target.

    For a classifier or a click model (bags of words, one-hot features: the
    (sparse features, dense label) pairs of ``TensorDataset(x, y)``) the
    target is the dense labels, ``(rows,)`` or ``(rows, k)``: each batch's
    ``y`` is their rows stacked, ``labels[batch.row_index]``, dense.  Every
    value of a dense target is a label, zeros included: a dense matrix whose
    zeros are missing entries goes through :func:`nnsparse.sparsify` first.

    Args:
        input (Tensor): sparse CSR or COO ``(rows, width)``.
        target (Tensor, optional): sparse CSR or COO ``(rows, target_width)``,
            or dense labels ``(rows,)`` or ``(rows, k)`` of any dtype (kept on
            the CPU, detached): the same number of rows as ``input``.
        layout (torch.layout): the layout of collated batches,
            ``torch.sparse_csr`` (default) or ``torch.sparse_coo``.

    Raises:
        TypeError: an ``input`` that is not sparse COO or CSR, a ``target`` that is
            neither that nor a dense tensor (a numpy ``target``: the message says how
            labels go in), or a bad ``layout``; an index that is not an integer.
        ValueError: a sparse matrix that is not 2-D or has invalid indices, dense
            labels that are not 1-D or 2-D, or a target with another row count.

    Example::

        >>> from torch.utils.data import DataLoader
        >>> x = torch.tensor([[1., 0., 2.], [0., 0., 0.], [0., 3., 0.]]).to_sparse_csr()
        >>> ds = SparseRowDataset(x)
        >>> ds[0]
        (0, SparseRow(indices=tensor([0, 2]), values=tensor([1., 2.])))
        >>> loader = DataLoader(ds, batch_size=2, collate_fn=ds.collate)
        >>> batch = next(iter(loader))
        >>> x, y = batch
        >>> batch.row_index, x.crow_indices(), x.col_indices(), y is None
        (tensor([0, 1]), tensor([0, 2, 2]), tensor([0, 2]), True)
        >>> clicks = SparseRowDataset(torch.eye(3).to_sparse_csr(), torch.tensor([1, 0, 1]))
        >>> x, y = clicks.collate([clicks[2], clicks[1]])   # dense labels: stacked
        >>> y
        tensor([1, 0])
    """

    def __init__(self, input: Tensor, target: Optional[Tensor] = None,
                 layout: torch.layout = torch.sparse_csr) -> None:
        if layout not in (torch.sparse_csr, torch.sparse_coo):
            raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
        inputs = _as_csr(input, "input")
        targets, labels = None, None
        if isinstance(target, Tensor) and target.layout == torch.strided:
            labels = _as_labels(target, input.shape[0])
        elif target is not None:
            targets = _as_csr(target, "target")
            if target.shape[0] != input.shape[0]:
                raise ValueError(f"target must have {input.shape[0]} rows like input, "
                                 f"got {target.shape[0]}")
        self.layout = layout
        self._input, self._target, self._labels = inputs, targets, labels
        self.width, self.rows = input.shape[1], input.shape[0]
        # (of a sparse target; of dense labels, k of (rows, k), None for (rows,))
        self.target_width: Optional[int] = (
            None if target is None or target.dim() != 2 else target.shape[1])
        # Python ints: slicing with them is much cheaper than with 0-dim tensors.
        self._bounds = [inputs[0].tolist()]
        if targets is not None:
            self._bounds.append(targets[0].tolist())
        self._checked_versions = self._versions_now()

    def _versions_now(self) -> Tuple[int, ...]:
        """The version counters of the matrices' tensors (the items are views of them)."""
        return tuple(_version(t) for parts in (self._input, self._target) if parts is not None
                     for t in parts)

    def _check_unedited(self) -> None:
        """The matrices as checked, else checked again (one pass, once per edit): an item's
        tensors are views of them, and an index edited in place would enter a trusted
        batch (a kernel's out-of-range error, or worse)."""
        now = self._versions_now()
        if now == self.__dict__.get("_checked_versions"):
            return
        for name, parts, width in (("input", self._input, self.width),
                                   ("target", self._target, self.target_width)):
            if parts is not None:
                crow, col, values = parts
                _check_csr(crow, col, values, self.rows, cast(int, width),
                           f"the dataset's {name} (edited since it was built)")
        self._bounds = [self._input[0].tolist()]
        if self._target is not None:
            self._bounds.append(self._target[0].tolist())
        self._checked_versions = now

    def __len__(self) -> int:
        return self.rows

    def _target_form(self) -> str:
        """``"none"``, ``"sparse"`` or ``"dense"``: what this dataset's target is."""
        return ("sparse" if self._target is not None else
                "dense" if self.__dict__.get("_labels") is not None else "none")

    def _row(self, k: int, i: int) -> SparseRow:
        parts = self._input if k == 0 or self._target is None else self._target
        begin, end = self._bounds[k][i], self._bounds[k][i + 1]
        return SparseRow(parts[1][begin:end], parts[2][begin:end])

    def __getitem__(self, i: int) -> Tuple[Any, ...]:
        # an int, a numpy int or a 0-d integer tensor, as every count: not a bool, nor a
        # numpy timedelta64 (no int64 check: a larger one is out of range, next)
        i = as_int(i, "index", expected=None)
        if not -self.rows <= i < self.rows:
            raise IndexError(f"index must be in [-{self.rows}, {self.rows}), got {i}")
        i %= self.rows
        form = self._target_form()
        if form == "none":
            return i, self._row(0, i)
        if form == "dense":
            return i, self._row(0, i), cast(Tensor, self._labels)[i]
        return i, self._row(0, i), self._row(1, i)

    def _check_own(self, pairs: List[Tuple[Any, Any]], k: int) -> None:
        """Trust the rows that are this dataset's own (views of its checked index tensor at
        their row's bounds, of its dtype and stride, with 1-D values of the dataset's dtype
        and device: O(1) each); check any other completely (another dataset's
        item, a row rebuilt elsewhere), so no invalid row enters a trusted batch."""
        parts = self._input if k == 0 or self._target is None else self._target
        base, bounds, rows = parts[1], self._bounds[k], self.rows
        # row i's view starts bounds[i] elements into the 1-D index tensor, and reads
        # exactly base[bounds[i]:bounds[i + 1]] only with base's dtype and stride: a view
        # of the same storage with another stride (a file can save one beside the matrix)
        # reads unchecked memory past the index tensor
        pointer, size = base.data_ptr(), base.stride(0) * base.element_size()
        dtype, stride, values = base.dtype, base.stride(), parts[2]
        for i, row in pairs:
            if not (type(i) is int and 0 <= i < rows):
                break
            ind, val = row.indices, row.values
            if not (type(ind) is Tensor and type(val) is Tensor
                    and ind.layout == torch.strided and val.layout == torch.strided):
                break
            if (ind.data_ptr() != pointer + bounds[i] * size or ind.dtype != dtype
                    or ind.stride() != stride or len(ind) != bounds[i + 1] - bounds[i]):
                break
            if (val.dim() != 1 or len(val) != len(ind) or val.dtype != values.dtype
                    or val.device != values.device):
                break
        else:
            return
        for n, (i, _) in enumerate(pairs):
            if not (is_int(i) or isinstance(i, Tensor)) or \
                    not 0 <= int(i) < self.rows:
                raise ValueError(f"items[{n}] row must be a row of this dataset, in "
                                 f"[0, {self.rows}), got {i!r}")
        _check_rows(pairs, self.width if k == 0 else cast(int, self.target_width))
        # another dataset's rows of another dtype or device made a batch of that dtype (a
        # float64 batch from a float32 dataset) or failed in torch.cat
        values = parts[2]
        for n, (_, row) in enumerate(pairs):
            if row.values.numel() and (row.values.dtype != values.dtype
                                       or row.values.device != values.device):
                # (a device is a wrong value, as _check_rows and SparseRowBatch say it)
                error = ValueError if row.values.device != values.device else TypeError
                raise error(f"items[{n}] holds values of dtype {row.values.dtype} on "
                                f"{row.values.device}, this dataset's are {values.dtype} on "
                                f"{values.device}; collate each dataset's items with its own "
                                f"collate")

    def collate(self, items: List[Tuple[Any, ...]]) -> SparseRowBatch:
        """``collate_fn`` for a ``DataLoader``: a list of items -> one :class:`SparseRowBatch`.

        The items' rows come from the checked matrices, so the batch is built
        without another check and trusted.  An item that is not this dataset's
        own (another dataset's, a row built by hand, one rebuilt from a pickle)
        is recognised in O(1) and checked completely instead.

        Raises:
            TypeError: items that are not ``dataset[i]`` tuples of rows (the message
                names the first), among them the items of a dataset with a target given
                to one without (their targets would be dropped), and back, and those of a
                dataset of dense labels given to one with a sparse target, and back; a
                foreign row whose values differ in dtype from this dataset's, foreign
                labels of another dtype.
            ValueError: a foreign row outside this dataset's rows or width, on another
                device, or with unsorted or repeated indices; foreign labels of another
                shape or device.
        """
        # The rows are trusted (they come from the checked matrices): only their kind is checked.
        form = self._target_form()
        kind = "(row, row_data)" if form == "none" else "(row, input, target)"
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"items must be a list of this dataset's items, {kind} tuples as "
                            f"dataset[i] returns, got {type(items).__name__}")
        fields = 2 if form == "none" else 3
        last = Tensor if form == "dense" else SparseRow
        # the items' length too: a target dataset's (row, input, target) given to a dataset
        # without one lost its target without a word.  One set of (length, kinds) first (the
        # loop below, which names the item, runs on a refusal only).
        try:
            kinds = {(len(it), type(it[1]), type(it[-1])) for it in items}
        except (TypeError, IndexError, KeyError):
            kinds = None
        if kinds != {(fields, SparseRow, last)}:
            for i, it in enumerate(items):
                got = _item_form(it)
                if got != form:
                    hint = _TARGET_HINT.get((form, got), "") if got is not None else ""
                    raise TypeError(f"items must be a list of this dataset's items, {kind} "
                                    f"tuples as dataset[i] returns, got items[{i}] = "
                                    f"{_item_kind(it)}{hint}")
        pairs = [(it[0], it[1]) for it in items]
        targets = None if form != "sparse" else [(it[0], it[2]) for it in items]
        self._check_unedited()
        self._check_own(pairs, 0)
        if targets is not None:
            self._check_own(targets, 1)
        index, input = _collate(pairs, self.width, self.layout)
        if form == "dense":
            return SparseRowBatch(input, self._stack_labels([it[2] for it in items]), index)
        if form == "none":
            return SparseRowBatch(input, None, index)
        assert self.target_width is not None
        assert targets is not None
        _, target = _collate(targets, self.target_width, self.layout)
        return SparseRowBatch(input, target, index)

    def _stack_labels(self, labels: List[Tensor]) -> Tensor:
        """The items' dense labels as one ``(batch,)`` or ``(batch, k)`` tensor; foreign ones
        (another dataset's) of another shape, dtype or device refused by name (torch.stack
        would promote the dtype, or fail naming no item)."""
        base = cast(Tensor, self._labels)
        shape, dtype, device = base.shape[1:], base.dtype, base.device
        for n, t in enumerate(labels):
            if (t.layout != torch.strided or t.shape != shape or t.dtype != dtype
                    or t.device != device):
                error = TypeError if t.layout != torch.strided or t.dtype != dtype \
                    else ValueError
                layout = "" if t.layout == torch.strided else f"layout {t.layout}, "
                raise error(f"items[{n}] holds labels of {layout}shape {tuple(t.shape)} and "
                            f"dtype {t.dtype} on {t.device}, this dataset's are of shape "
                            f"{tuple(shape)} and dtype {dtype} on {device}; collate each "
                            f"dataset's items with its own collate")
        return torch.stack(labels) if labels else base.new_empty((0, *shape))
