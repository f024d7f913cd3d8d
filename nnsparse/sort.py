"""Sorting and ranking the specified entries of sparse vectors and batches."""
from __future__ import annotations

import math
from typing import (Any, Dict, List, Literal, NamedTuple, Sequence, Tuple, TypeVar, Union,
                    cast, overload)

import torch
from torch import Tensor

from ._forms import (SparseBatch, SparseLike, as_count, as_flag, as_sparse_batch,
                     check_kernel_dtype, compile_boundary)

__all__ = ["ssort", "ssort_by_index", "stopk", "SortResult", "TopkResult"]

# inplace=True gives back x itself, its type kept (a pair tensor, a list or a tuple of them)
_X = TypeVar("_X", bound=SparseLike)


class SortResult(NamedTuple):
    """``(values, indices)`` of :func:`ssort` and :func:`ssort_by_index` for a torch sparse
    tensor or a list of sparse vectors, as ``torch.sort``'s: a named tuple, unpacked or
    read by field.

    Example::

        >>> x = torch.sparse_coo_tensor([[1, 3, 6]], [1., 4., 2.], (8,))
        >>> values, indices = ssort(x, descending=True)
        >>> indices
        tensor([3, 6, 1])
        >>> ssort(x).values
        tensor([1., 2., 4.])
    """

    values: Tensor
    indices: Tensor


class TopkResult(NamedTuple):
    """``(values, indices)`` of :func:`stopk`, as ``torch.topk``'s: a named tuple,
    unpacked or read by field.

    Example::

        >>> x = torch.sparse_coo_tensor([[1, 3, 6]], [1., 4., 2.], (8,))
        >>> values, indices = stopk(x, 2)
        >>> values, indices
        (tensor([4., 2.]), tensor([3, 6]))
        >>> stopk(x, 1).indices
        tensor([3])
    """

    values: Tensor
    indices: Tensor


def _check_values(batch: SparseBatch, name: str) -> None:
    if batch.dtype == torch.bool or batch.dtype.is_complex:
        raise TypeError(f"{name} values must be real numbers to be ranked, got dtype {batch.dtype}")
    check_kernel_dtype(batch.dtype, f"{name} values")


def _extreme(dtype: torch.dtype, high: bool) -> float:
    """The value that ranks after every other one: +-inf, or the integer dtype's bound."""
    if dtype.is_floating_point:
        return math.inf if high else -math.inf
    info = torch.iinfo(dtype)
    return info.max if high else info.min


def _row_order(row: Tensor, key: Tensor, descending: bool) -> Tensor:
    """The permutation that sorts ``key`` within each row, rows kept in increasing order.

    A segmented sort as two stable sorts: by key, then by row; the second keeps
    the key order inside each row.  Ties keep the entries' incoming order.
    """
    order = torch.sort(key, descending=descending, stable=True).indices
    return order[torch.sort(row[order], stable=True).indices]


def _pad(batch: SparseBatch, order: Tensor, k: int, fill: float) -> SortResult:
    """Entries taken in ``order`` (grouped by row) as ``(rows, k)`` tensors.

    The first ``k`` entries of each row are kept; shorter rows are padded at
    their end with value ``fill`` and index ``-1``.
    """
    row, col, values = batch.row[order], batch.col[order], batch.values[order]
    counts = batch.row_counts()
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(row.shape[0], device=row.device) - start[row]
    keep = pos < k
    at = (row[keep], pos[keep])
    out_values = values.new_full((batch.rows, k), fill).index_put(at, values[keep])
    out_index = col.new_full((batch.rows, k), -1).index_put(at, col[keep])
    return SortResult(out_values, out_index)


def _longest_row(batch: SparseBatch) -> int:
    return int(batch.row_counts().max()) if batch.rows and batch.nnz else 0


def _check_writable(rows: List[Tensor], name: str, listed: bool) -> None:
    """Refuse, before any row is written, pair tensors torch would not let ``copy_``
    write (a list would otherwise be left half reordered): a leaf that requires grad
    or a view of one (in grad mode), an inference tensor outside inference mode, an
    expanded tensor whose elements share memory."""
    for i, p in enumerate(rows):
        where = f" at {name}[{i}]" if listed else ""
        if torch.is_grad_enabled() and p.requires_grad and (
                p.is_leaf or (p._base is not None and p._base.is_leaf)):
            what = "a leaf tensor" if p.is_leaf else "a view of a leaf tensor"
            raise RuntimeError(f"inplace=True cannot reorder {name}: {what} that requires "
                               f"grad{where}; sort a copy, or under torch.no_grad()")
        if p.is_inference() and not torch.is_inference_mode_enabled():
            raise RuntimeError(f"inplace=True cannot reorder {name}: an inference tensor{where} "
                               "outside torch.inference_mode; sort a copy (.clone())")
        # An expanded dimension (size > 1, stride 0): its elements share memory.
        if any(n > 1 and st == 0 for n, st in zip(p.shape, p.stride())):
            raise RuntimeError(f"inplace=True cannot reorder {name}: an expanded tensor{where}, "
                               "whose elements share memory; sort a copy (.clone())")


def _element_offsets(p: Tensor) -> Tensor:
    """The storage offsets (in elements) of every element of ``p``, int64 on the CPU
    (from its shape and strides: no data is read)."""
    off = torch.tensor([p.storage_offset()], dtype=torch.int64)
    for n, stride in zip(p.shape, p.stride()):
        off = (off[:, None] + torch.arange(n, dtype=torch.int64) * stride).reshape(-1)
    return off


def _check_disjoint(rows: List[Tensor], name: str) -> None:
    """Refuse a list whose pair tensors share elements (overlapping views of one tensor):
    each row is written with its own sorted entries, so a shared element would end up
    holding another row's entry and an entry of the tensor would be lost.  The same view
    listed twice is allowed (both writes are alike)."""
    by_storage: Dict[Tuple[torch.device, int], List[int]] = {}
    for i, p in enumerate(rows):
        if p.numel():
            by_storage.setdefault((p.device, p.untyped_storage().data_ptr()), []).append(i)
    for listed in by_storage.values():
        views: Dict[Tuple[Any, ...], int] = {}
        for i in listed:  # one of each distinct view
            views.setdefault((rows[i].storage_offset(), rows[i].shape, rows[i].stride()), i)
        if len(views) < 2:
            continue
        owners = list(views.values())
        offsets = [_element_offsets(rows[i]) for i in owners]
        owner = torch.cat([torch.full((o.numel(),), j) for j, o in enumerate(offsets)])
        key, order = torch.sort(torch.cat(offsets), stable=True)
        shared = (key[1:] == key[:-1]) & (owner[order][1:] != owner[order][:-1])
        if bool(shared.any()):
            at = int(shared.nonzero()[0])
            i, j = sorted((owners[int(owner[order][at])], owners[int(owner[order][at + 1])]))
            raise RuntimeError(f"inplace=True cannot reorder {name}: {name}[{i}] and "
                               f"{name}[{j}] share elements (overlapping views of one "
                               f"tensor), and each is written with its own sorted entries; "
                               f"sort copies (.clone())")


def _sort(x: Any, by_index: bool, descending: bool, inplace: bool,
          name: str) -> Union[SortResult, Tensor, Sequence[Tensor]]:
    descending, inplace = as_flag(descending, "descending"), as_flag(inplace, "inplace")
    batch = as_sparse_batch(x, name=name)
    _check_values(batch, name)
    if inplace and batch.form in ("pairs", "pair_list"):
        _check_writable([x] if batch.form == "pairs" else x, name, batch.form == "pair_list")
        if batch.form == "pair_list":
            _check_disjoint(x, name)
    if batch.form in ("pairs", "pair_list"):
        # Lua parity: the pair tensors are reordered as they are, duplicates kept.
        order = _row_order(batch.row, batch.col if by_index else batch.values, descending)
        if batch.form == "pairs":
            out = x.reshape(-1, 2)[order]
            return cast(Tensor, x).copy_(out.reshape(x.shape)) if inplace else out
        # the batch's dtype (the rows with entries share it; torch.cat would promote
        # to an empty row's wider dtype), each row given back in its own
        pairs = torch.cat([p.reshape(-1, 2).to(batch.dtype) for p in x])[order]
        rows = list(pairs.split(batch.row_counts().tolist()))  # type: ignore[no-untyped-call]
        if inplace:
            # every row is read (by the cat above) before any is written
            for p, row in zip(x, rows):
                p.copy_(row.reshape(p.shape))
            return cast(Sequence[Tensor], x)  # the list or tuple the caller gave
        return [row.to(p.dtype) for p, row in zip(x, rows)]
    if inplace:
        raise NotImplementedError(
            f"inplace=True reorders (k, 2) pair tensors (the Lua form), got {name} in form "
            f"'{batch.form}': a torch sparse tensor keeps its own entry order; use the returned "
            "(values, indices)")
    batch = batch.coalesce()  # duplicates are one entry: their sum
    if by_index:
        # Coalesced entries already have increasing columns within each row.
        order = torch.arange(batch.nnz, device=batch.device)
        if descending:
            order = _row_order(batch.row, batch.col, True)
        fill: float = 0
    else:
        order = _row_order(batch.row, batch.values, descending)
        fill = _extreme(batch.dtype, high=not descending)
    result = _pad(batch, order, _longest_row(batch), fill)
    if batch.is_vector:
        return SortResult(result.values[0], result.indices[0])
    return result


@overload
def ssort(x: _X, descending: bool, inplace: Literal[True]) -> _X: ...
@overload
def ssort(x: _X, descending: bool = ..., *, inplace: Literal[True]) -> _X: ...
@overload
def ssort(x: Tensor, descending: bool = ...,
          inplace: Literal[False] = ...) -> Union[SortResult, Tensor]: ...
@overload
def ssort(x: Sequence[Tensor], descending: bool = ...,
          inplace: Literal[False] = ...) -> Union[SortResult, List[Tensor]]: ...
@overload
def ssort(x: SparseLike, descending: bool = ...,
          inplace: bool = ...) -> Union[SortResult, Tensor, Sequence[Tensor]]: ...


@compile_boundary
def ssort(x: SparseLike, descending: bool = False,
          inplace: bool = False) -> Union[SortResult, Tensor, Sequence[Tensor]]:
    r"""Sort the specified entries of a sparse vector, or of each row of a batch, by value.

    Unlike Lua nnsparse, whose README announced a descending default, the
    default here is ascending, as in :func:`torch.sort` (the Lua code sorted
    ascending by default too).  Ties keep increasing index order (the sort is
    stable); NaN values sort as the largest, as in :func:`torch.sort`.

    Args:
        x: a sparse COO vector ``(n,)`` or batch ``(rows, n)``, a sparse CSR
            batch, a list of sparse vectors, a ``(k, 2)`` pair tensor of
            ``[index, value]`` rows, or a list of pair tensors.
        descending (bool): sort from the largest value down. Default: False.
        inplace (bool): reorder the pair tensor(s) themselves and return
            them (Lua's ``ssort(descend, inplace)``); pair forms only.
            Default: False.

    Returns:
        For a sparse vector, a named tuple ``(values, indices)`` of shape
        ``(nnz,)``, as :func:`torch.sort`: the values in order and their
        column indices (int64).  Duplicate entries of an uncoalesced tensor
        are summed first.

        For a sparse batch (COO, CSR, list of sparse vectors), ``(values,
        indices)`` of shape ``(rows, max_nnz)``, ``max_nnz`` the largest number
        of specified entries in a row; a shorter row is padded at its end with
        index ``-1`` and value ``+inf`` (ascending) or ``-inf`` (descending)
        (the integer dtype's bounds for integer values), so each padded row
        is what ``torch.sort`` gives on the dense row with its unspecified
        entries set to that value.  ``(indices >= 0).sum(1)`` is the row
        lengths.  One long row makes every row that long: for very uneven
        rows, pass a list of pair tensors (:func:`nnsparse.to_pairs`) to get
        one sorted tensor per row instead.

        For a pair tensor (the Lua form), the pair tensor with its rows
        reordered; for a list (or tuple) of them, a new list of reordered pair
        tensors.  With ``inplace=True``, ``x`` itself, reordered: the pair
        tensor, or the list or tuple given.  Pair tensors are reordered as
        they are: duplicate indices are kept.

        Values keep ``x``'s dtype and device; gradients flow back to the
        specified values only.

    Raises:
        TypeError: ``x`` is not an accepted form, ``descending`` or
            ``inplace`` is not a bool, or the values are boolean, complex or
            of a dtype torch's sparse kernels lack (uint16, uint32, uint64).
        ValueError: bad indices (see :func:`nnsparse.densify`).
        NotImplementedError: ``inplace=True`` for a torch sparse tensor or a
            list of sparse vectors (their entry order is torch's).
        RuntimeError: ``inplace=True`` on a pair tensor that is a leaf
            requiring grad or a view of one (outside :func:`torch.no_grad`), an
            inference tensor (outside :func:`torch.inference_mode`), or an
            expanded tensor; nothing is written then, in no row of a list.

    Example::

        >>> x = torch.sparse_coo_tensor([[1, 3, 6]], [1., 4., 2.], (8,))
        >>> ssort(x)
        SortResult(values=tensor([1., 2., 4.]), indices=tensor([1, 6, 3]))
        >>> ssort(torch.tensor([[1., 1.], [3., 4.], [6., 2.]]), descending=True)
        tensor([[3., 4.],
                [6., 2.],
                [1., 1.]])
        >>> ssort(torch.tensor([[0., 3., 1.], [0., 0., 0.]]).to_sparse())
        SortResult(values=tensor([[1., 3.],
                [inf, inf]]), indices=tensor([[ 2,  1],
                [-1, -1]]))
    """
    return _sort(x, by_index=False, descending=descending, inplace=inplace, name="x")


@overload
def ssort_by_index(x: _X, descending: bool, inplace: Literal[True]) -> _X: ...
@overload
def ssort_by_index(x: _X, descending: bool = ..., *, inplace: Literal[True]) -> _X: ...
@overload
def ssort_by_index(x: Tensor, descending: bool = ...,
                   inplace: Literal[False] = ...) -> Union[SortResult, Tensor]: ...
@overload
def ssort_by_index(x: Sequence[Tensor], descending: bool = ...,
                   inplace: Literal[False] = ...) -> Union[SortResult, List[Tensor]]: ...
@overload
def ssort_by_index(x: SparseLike, descending: bool = ...,
                   inplace: bool = ...) -> Union[SortResult, Tensor, Sequence[Tensor]]: ...


@compile_boundary
def ssort_by_index(x: SparseLike, descending: bool = False,
                   inplace: bool = False) -> Union[SortResult, Tensor, Sequence[Tensor]]:
    r"""Sort the specified entries of a sparse vector, or of each row of a batch, by index.

    The Lua nnsparse README announced a descending default; as in
    :func:`torch.sort` (and in the Lua code) the default here is ascending.

    Args:
        x: a sparse COO vector or batch, a sparse CSR batch, a list of sparse
            vectors, a ``(k, 2)`` pair tensor, or a list of pair tensors.
        descending (bool): sort from the largest index down. Default: False.
        inplace (bool): reorder the pair tensor(s) themselves and return
            them, as :func:`ssort`; pair forms only. Default: False.

    Returns:
        As :func:`ssort`: ``(values, indices)`` of shape ``(nnz,)`` for a
        sparse vector, ``(rows, max_nnz)`` for a sparse batch, the reordered
        pair tensor(s) for the pair forms (``x`` itself with ``inplace=True``).
        Duplicate entries of an uncoalesced tensor are summed first.  A padded batch entry has index ``-1`` and
        value 0, so padded values add nothing to a sum.

    Raises:
        TypeError: ``x`` is not an accepted form, ``descending`` or
            ``inplace`` is not a bool, or the values are boolean, complex or
            of a dtype torch's sparse kernels lack (uint16, uint32, uint64).
        ValueError: bad indices.
        NotImplementedError: ``inplace=True`` for a torch sparse tensor or a
            list of sparse vectors.
        RuntimeError: ``inplace=True`` on a pair tensor torch cannot write in
            place, as :func:`ssort`.

    Example::

        >>> ssort_by_index(torch.tensor([[3., 1.], [1., 4.], [6., 2.]]))
        tensor([[1., 4.],
                [3., 1.],
                [6., 2.]])
        >>> x = torch.sparse_coo_tensor([[6, 1, 3]], [2., 4., 1.], (8,))
        >>> ssort_by_index(x, descending=True)
        SortResult(values=tensor([2., 1., 4.]), indices=tensor([6, 3, 1]))
    """
    return _sort(x, by_index=True, descending=descending, inplace=inplace, name="x")


@compile_boundary
def stopk(x: SparseLike, k: int) -> TopkResult:
    r"""The ``k`` largest specified entries of a sparse vector, or of each row of a batch.

    The ranking step of a recommender: the top ``k`` predicted items of each
    user, among the entries a sparse tensor specifies.  Duplicate entries
    (uncoalesced COO, repeated pair indices) are summed first.  The entries
    come from the largest down; ties keep increasing index order; NaN values
    rank first, as in :func:`torch.topk`.

    Args:
        x: a sparse COO vector ``(n,)`` or batch ``(rows, n)``, a sparse CSR
            batch, a list of sparse vectors, a ``(k, 2)`` pair tensor or a
            list of pair tensors.
        k (int): how many entries to keep per row, ``k >= 0``; any such int
            below ``2**63`` (a numpy int or a 0-d integer tensor too, as
            :func:`torch.topk` takes).

    Returns:
        A named tuple ``(values, indices)`` of shape ``(k,)`` for a vector
        (sparse COO vector or pair tensor) or ``(rows, k)`` for a batch, as
        :func:`torch.topk`, whatever the rows hold, so that the results of
        several batches concatenate.  A ``k`` above the width ``n`` of a
        torch sparse tensor (or list of them) is taken as ``n`` (no row holds
        more entries; ``torch.topk`` would refuse it): ``stopk(x, 2**62)`` is
        every entry, in memory bounded by ``rows * n``, never by ``k``.  Pair
        tensors declare no width (their largest index + 1 varies with the
        data): their result keeps ``k`` columns, allocated as asked.  A row
        with fewer than ``k`` specified entries is padded at its end with
        index ``-1`` and value ``-inf`` (the dtype's minimum for integer
        values): what ``torch.topk`` gives on the dense rows with their
        unspecified entries set to ``-inf``, except for the index.  Values
        keep ``x``'s dtype and device; gradients flow back to the selected
        specified values only.

    Raises:
        TypeError: ``x`` is not an accepted form, ``k`` is not an int (a bool, a
            float, a bool or floating tensor, a tensor of one element but 1-d), or the
            values are boolean, complex or of a dtype torch's sparse kernels
            lack (uint16, uint32, uint64).
        ValueError: ``k`` is negative, or bad indices.

    Example::

        >>> scores = torch.tensor([[0.1, 0.0, 0.9, 0.5], [0.0, 0.7, 0.0, 0.0]]).to_sparse()
        >>> stopk(scores, 2)
        TopkResult(values=tensor([[0.9000, 0.5000],
                [0.7000,   -inf]]), indices=tensor([[ 2,  3],
                [ 1, -1]]))
        >>> stopk(scores, 2**62).indices  # k above the width 4: every entry
        tensor([[ 2,  3,  0, -1],
                [ 1, -1, -1, -1]])
    """
    # every count's rule (a 0-d integer tensor passes; a bool tensor or a tensor of
    # one element but more dimensions, which operator.index took, does not)
    k = as_count("k", k, 0, must="non-negative")
    batch = as_sparse_batch(x, name="x")
    _check_values(batch, "x")
    # no row holds more than a declared width (a torch tensor's size): a k of 2**62 must
    # not size the result.  A pair form's width is its largest index + 1, which varies
    # with the data: its result keeps k columns, so that results concatenate.
    declared = batch.form not in ("pairs", "pair_list")
    batch = batch.coalesce()
    width = min(k, batch.width) if declared else k
    order = _row_order(batch.row, batch.values, descending=True)
    values, indices = _pad(batch, order, width, _extreme(batch.dtype, high=False))
    if batch.is_vector:
        return TopkResult(values[0], indices[0])
    return TopkResult(values, indices)
