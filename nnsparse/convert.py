"""Conversions between dense tensors, torch sparse tensors and the Lua pair form."""
from __future__ import annotations

import numbers

import math
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from . import _index
from ._forms import (EMPTY_ROWS_TENSOR, SparseBatch, SparseLike, _CONVERT_X, _PAIRS_OF_X, _a,
                     _as_pairs, _sparse_coo, _sparse_csr, as_count, as_int, is_int,
                     as_sparse_batch, check_kernel_dtype, holds_exactly, refuse_meta,
                     check_int64, check_numel, exact_index, int64_message, resolve_size,
                     scipy_sparse_hint, trust, compile_boundary, sparse_output_boundary)

__all__ = ["sparsify", "densify", "to_pairs", "from_pairs"]

_Size = Union[int, Sequence[int]]


def _check_elem(elem: Any, fill: bool = False) -> Any:
    """``elem`` checked, as a Python number (a numpy scalar's ``item()``: torch reads a
    numpy complex scalar as its real part, with a ComplexWarning).

    ``fill``: ``elem`` fills the unspecified entries (densify's), so a 0-d tensor that
    requires grad is refused where grad is enabled: its number fills them, and the
    gradient ``masked_fill`` would give it was silently lost.  (``sparsify``'s is only
    compared, which has no gradient.)"""
    if isinstance(elem, Tensor) and elem.dim() == 0 and elem.dtype != torch.bool:
        # a 0-d tensor, which torch.full and masked_fill take as a fill value: its number
        refuse_meta(elem, "elem")
        if fill and elem.requires_grad and torch.is_grad_enabled():
            raise ValueError("elem must not require grad (the fill is read as a number: no "
                             "gradient would reach it), got a tensor that does; pass "
                             "elem.detach() or a number")
        elem = elem.item()
    if isinstance(elem, bool) or not isinstance(elem, numbers.Number) \
            or (isinstance(elem, numbers.Integral) and not is_int(elem)):
        # (numbers.Integral takes a numpy timedelta64, which torch takes as no number)
        raise TypeError(f"elem must be a number, got {type(elem).__name__} {elem!r}")
    if isinstance(elem, numbers.Integral) and not -2 ** 63 <= int(elem) < 2 ** 63:
        raise ValueError(int64_message("elem", int(elem)))
    if not isinstance(elem, (int, float, complex)):  # numpy scalars pass, as torch takes them
        try:
            torch.tensor(elem)
        except (TypeError, ValueError, RuntimeError):  # Fraction, Decimal
            raise TypeError(f"elem must be an int, float or complex number (or a numpy "
                            f"scalar), got {type(elem).__name__} {elem!r}") from None
        if hasattr(elem, "item"):
            return elem.item()
    return elem


def _check_elem_fits(elem: Any, dtype: torch.dtype) -> None:
    """``elem`` must be stored exactly in the values' dtype (a cast would change it silently);
    NaN only in floating (or complex) values."""
    if _is_nan(elem) and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"elem nan needs floating values, got dtype {dtype}")
    if not isinstance(elem, numbers.Real) and not dtype.is_complex:
        raise TypeError(f"elem must be a real number for values of dtype {dtype}, got {elem!r}")
    if _is_nan(elem) or holds_exactly(dtype, elem):
        return
    if dtype.is_floating_point:
        # a float rounds; beyond the dtype's largest finite value torch refuses it (inf passes)
        top = torch.finfo(dtype).max
        raise ValueError(f"elem must fit in the values' dtype {dtype} (a finite value in "
                         f"[{-top}, {top}], inf or nan), got {elem!r}")
    if dtype == torch.bool:
        raise ValueError(f"elem must be stored exactly in the values' dtype torch.bool "
                         f"(0 or 1), got {elem!r}")
    info = torch.iinfo(dtype)
    raise ValueError(f"elem must be stored exactly in the values' dtype {dtype} (an integer "
                     f"in [{info.min}, {info.max}]), got {elem!r}")


def _is_nan(elem: float) -> bool:
    """Whether ``elem`` is a real NaN (a numpy float32 one too)."""
    return (isinstance(elem, numbers.Real) and not isinstance(elem, numbers.Integral)
            and math.isnan(elem))


def _specified_mask(x: Tensor, elem: float) -> Tensor:
    """True where ``x`` differs from ``elem``; NaN ``elem`` keeps every non-NaN entry."""
    if _is_nan(elem):
        return ~torch.isnan(x)
    return x != elem


@sparse_output_boundary
def sparsify(x: Tensor, elem: float = 0, offset: int = 0,
             layout: torch.layout = torch.sparse_coo) -> Tensor:
    r"""Turn a dense vector or batch into a sparse one, leaving out every ``elem``.

    Args:
        x (Tensor): dense (strided), shape ``(n,)`` for a vector or
            ``(rows, n)`` for a batch whose rows are samples.
        elem (float): the value that means "not specified"; may be ``nan``
            (missing ratings marked NaN while 0 is a real value). Default: 0.
        offset (int): added to every column index; the width grows by it.
        layout (torch.layout): ``torch.sparse_coo`` (default) or, for a batch,
            ``torch.sparse_csr``.

    Returns:
        A coalesced sparse tensor of shape ``(n + offset,)`` or
        ``(rows, n + offset)`` on ``x``'s device with ``x``'s dtype.  Its values
        are a differentiable gather of ``x``: gradients reach ``x`` at the
        specified entries only.

    Raises:
        TypeError: ``x`` is not a dense tensor, ``elem`` is not a number torch
            takes (a ``Fraction``, a ``Decimal``) or is complex for real ``x``,
            ``layout`` is not a sparse layout, or ``offset`` is not an int.
        ValueError: ``x`` has more than 2 dimensions or is on the meta device,
            an ``elem`` that ``x``'s dtype cannot hold (``0.5`` or ``nan`` for
            integers, ``1000`` for int8: it would equal no entry),
            ``offset`` is negative or makes the result too large for int64 sizes,
            or CSR is asked for a vector.

    Example::

        >>> x = torch.tensor([0., 1., 4., 0., 0., 8.])
        >>> s = sparsify(x)
        >>> s.indices(), s.values()
        (tensor([[1, 2, 5]]), tensor([1., 4., 8.]))
        >>> sparsify(torch.tensor([[1., 0.], [0., 2.]]), layout=torch.sparse_csr).crow_indices()
        tensor([0, 1, 2])
    """
    if not isinstance(x, Tensor) or x.layout != torch.strided:
        got = type(x).__name__ if not isinstance(x, Tensor) else f"layout {x.layout}"
        hint = scipy_sparse_hint(x, "x")
        raise TypeError(f"x must be a dense tensor, got {got}"
                        + (f" (sparse already){hint}" if hint else ""))
    if x.dim() not in (1, 2):
        raise ValueError(f"x must be 1-D (a vector) or 2-D (rows, n), got {x.dim()} dimensions")
    refuse_meta(x, "x")
    if isinstance(offset, (Tensor, np.ndarray)):  # a 0-d integer one, as every count takes
        offset = as_count("offset", offset, 0, must="non-negative")
    if is_int(offset) and offset > 0:
        # the result's size bounds offset, tighter than as_count's int64: said first
        size = (*x.shape[:-1], x.shape[-1] + int(offset))
        if math.prod(size) >= 2 ** 63:
            raise ValueError(f"offset must keep the result's size {size} within int64 elements, "
                             f"got {offset}")
    offset = as_count("offset", offset, 0, must="non-negative")
    size = (*x.shape[:-1], x.shape[-1] + offset)
    elem = _check_elem(elem)
    # an elem x's dtype cannot hold equals no entry: every entry would be kept, silently
    _check_elem_fits(elem, x.dtype)
    if layout not in (torch.sparse_coo, torch.sparse_csr):
        raise TypeError(f"layout must be torch.sparse_coo or torch.sparse_csr, got {layout}")
    if layout == torch.sparse_csr and x.dim() == 1:
        raise ValueError("layout torch.sparse_csr needs a 2-D x, got a vector")
    mask = _specified_mask(x, elem)
    values = x[mask]
    index = mask.nonzero().T  # row-major order, so the result is coalesced
    index[-1] += offset
    # valid by construction: the result is trusted (its structure attached, never checked)
    if layout == torch.sparse_csr:
        crow = _index.crow_from_counts(mask.sum(1))
        return trust(_sparse_csr(crow, index[1], values, size))
    return trust(_sparse_coo(index, values, size, coalesced=True))


def _batch_size(size: Optional[_Size], batch: SparseBatch) -> Tuple[int, int]:
    """``densify``'s ``size`` argument as ``(rows, width)``, checked against the data."""
    if size is None:
        return batch.shape
    if batch.is_vector:
        if isinstance(size, (tuple, list, torch.Size)):
            if len(size) != 1:
                raise ValueError(f"size of a vector must be an int, got {tuple(size)}")
            size = size[0]
        return resolve_size((1, size), batch)  # type: ignore[arg-type]
    if not isinstance(size, (int, tuple, list, torch.Size, str)):
        raise TypeError(f"size of a batch must be a (rows, width) tuple, got "
                        f"{type(size).__name__} {size!r}")
    if isinstance(size, int) or len(size) != 2:
        raise ValueError(f"size of a batch must be a (rows, width) tuple, got {size!r}")
    return resolve_size(tuple(size), batch)


def _size_from_tensor(size: Any) -> Any:
    """A ``size`` given as a tensor (Lua's ``torch.Tensor{2, 8}``) as ints; any other
    ``size`` as it came.

    Lua's tensors are floating (``torch.Tensor{2, 8}`` is a DoubleTensor, and its
    literal translation ``torch.Tensor([2, 8])`` a float32 one): a floating tensor
    passes when it holds whole numbers, each then read as the int it equals."""
    if not isinstance(size, Tensor):
        return size
    refuse_meta(size, "size")  # its ints cannot be read
    if size.layout != torch.strided or size.dtype == torch.bool or size.is_complex() \
            or size.dim() > 1:
        raise TypeError(f"size given as a tensor must be a 0-D or 1-D integer or floating "
                        f"tensor, got {_a(str(size.dim()))}-D {size.dtype} "
                        f"{str(size.layout).split('.')[-1]} tensor")
    values = size.reshape(-1).tolist()
    if size.is_floating_point():
        bad = [v for v in values if not (math.isfinite(v) and v == int(v))]
        if bad:
            raise ValueError(f"size given as a floating tensor must hold whole numbers, "
                             f"got {bad[0]} in {size.tolist()}")
        values = [int(v) for v in values]
    return values[0] if size.dim() == 0 else tuple(values)


@compile_boundary
def densify(x: SparseLike, elem: float = 0, size: Optional[_Size] = None) -> Tensor:
    r"""Turn any accepted sparse form into a dense tensor.

    Args:
        x: a sparse COO vector or batch, a sparse CSR batch, a ``(k, 2)`` pair
            tensor, or a list of sparse vectors or pair tensors (one per row).
        elem (float): the value of unspecified entries; may be ``nan``. Default: 0.
        size (int or tuple, optional): ``n`` for a vector, ``(rows, n)`` for a
            batch (ints, or a tensor of whole numbers as Lua's ``torch.Tensor{rows, n}``);
            by default the tensor's own size, or for pairs the largest index + 1
            and the number of rows.

    Returns:
        A dense tensor of shape ``(n,)`` or ``(rows, n)``, on ``x``'s device and
        with its dtype.  Duplicate (uncoalesced) entries are summed.  Gradients
        flow back to the specified values only.

    Raises:
        TypeError: ``x`` is not an accepted form, or its values have a dtype
            torch's sparse kernels lack (uint16, uint32, uint64, float8, ...), or
            ``elem`` is not a number torch takes (a ``Fraction``, a ``Decimal``).
        ValueError: bad indices, a ``size`` smaller than the data or beyond int64 (or a
            floating ``size`` tensor holding a fraction, NaN or inf), or an
            ``elem`` the values' dtype cannot hold: NaN for integer values, a
            fraction or one beyond the range of an integer dtype, a finite one
            beyond a floating dtype's largest (``inf`` and ``nan`` pass), other
            than 0 or 1 for bool values; an ``elem`` 0-d tensor that requires
            grad where grad is enabled (its number fills: no gradient reaches it).

    Example::

        >>> densify(torch.tensor([[0., 1.], [2., 4.], [5., 2.]]))
        tensor([1., 0., 4., 0., 0., 2.])
        >>> densify([torch.tensor([[0., 1.]]), torch.tensor([[3., 8.]])], size=(2, 5))
        tensor([[1., 0., 0., 0., 0.],
                [0., 0., 0., 8., 0.]])
    """
    size = _size_from_tensor(size)
    width = None
    if isinstance(x, (list, tuple)) and not x and size is not None:
        # an empty batch has no width of its own: size gives it
        if not isinstance(size, (tuple, list, torch.Size)) or len(size) != 2:
            raise ValueError(f"size of a batch must be a (rows, width) tuple, got {size!r}")
        width = as_int(size[1], "size", "hold ints")
        if width < 0:
            raise ValueError(f"size must have at least 0 columns, got {width}")
    batch = as_sparse_batch(x, name="x", width=width,
                            empty=f"pass size=(0, n), or {EMPTY_ROWS_TENSOR}")
    return _densify(batch, elem, *_batch_size(size, batch))


def _densify(batch: SparseBatch, elem: float, rows: int, width: int, name: str = "x") -> Tensor:
    """:func:`densify` of a normalised batch, ``(rows, width)`` (``(width,)`` for a vector);
    ``name``: the argument's, for messages."""
    elem = _check_elem(elem, fill=True)
    check_kernel_dtype(batch.dtype, f"{name} values")
    nbytes = rows * width * batch.values.element_size()
    if nbytes >= 2 ** 63:  # torch: "Storage size calculation overflowed"
        raise ValueError(f"{name} is too large to densify: ({rows}, {width}) "
                         f"{batch.dtype} would take {nbytes} bytes, beyond int64")
    _check_elem_fits(elem, batch.dtype)
    index = (batch.row, batch.col)
    out = batch.values.new_zeros(rows, width).index_put(index, batch.values, accumulate=True)
    if elem != 0:  # NaN != 0 too
        specified = torch.zeros(rows, width, dtype=torch.bool, device=batch.device)
        specified[index] = True
        out = torch.where(specified, out, torch.full_like(out, elem))
    return out[0] if batch.is_vector else out


@compile_boundary
def to_pairs(x: SparseLike) -> Union[Tensor, List[Tensor]]:
    r"""Convert a sparse vector to a ``(k, 2)`` pair tensor, a batch to a list of them.

    The pair form is the Lua nnsparse one with 0-based indices: each row is
    ``[index, value]``, the index stored in the values' dtype.

    Args:
        x: a sparse COO vector or batch, a CSR batch, or a list of sparse vectors.

    Returns:
        A ``(k, 2)`` tensor for a vector, a list of ``(k_i, 2)`` tensors (one per
        row, empty rows as ``(0, 2)``) for a batch, indices increasing.  Duplicate
        entries of an uncoalesced tensor are summed into one pair, as :func:`ssort`
        and :func:`stopk` read them.  Input already in the pair form (a pair tensor
        or a list of them) is returned as given, its order (e.g. :func:`ssort`'s)
        and repeated indices kept, as :func:`ssort` keeps them.  Values stay
        differentiable.

    Raises:
        TypeError: ``x`` is not an accepted form (a dense tensor, a number...).
        ValueError: float32/float16 values whose indices are too large to be
            stored exactly in that dtype.

    Example::

        >>> to_pairs(torch.tensor([0., 3., 0., 5.]).to_sparse())
        tensor([[1., 3.],
                [3., 5.]])
    """
    batch = as_sparse_batch(x, name="x")
    if batch.dtype.is_floating_point:
        exact = int(exact_index(batch.dtype, _PAIRS_OF_X, _CONVERT_X))  # (float8_e8m0fnu: none)
        if batch.nnz and batch.width > exact:
            raise ValueError(f"x has width {batch.width}, beyond {exact}: its indices cannot be "
                             f"stored exactly as {batch.dtype}; convert the values to float64")
    # the pairs of x's dense equivalent, as ssort / stopk / values_map read x: the repeated
    # positions of an uncoalesced COO tensor summed into one pair, the indices increasing
    # (a repeated index was two pairs, in the tensor's order).  Pairs are Lua's ordered
    # rows: kept as they are (as ssort's pair forms keep them), not sorted by index.
    if batch.form in ("pairs", "pair_list"):
        batch = batch.sorted_by_row()  # (the rows' own order within each row: stable)
    else:
        batch = batch.coalesce()
    if batch.is_vector:
        return _as_pairs(batch)
    return list(_as_pairs(batch).split(  # type: ignore[no-untyped-call]
        batch.row_counts().tolist()))


@sparse_output_boundary
def from_pairs(pairs: Union[Tensor, Sequence[Tensor]], size: Optional[int] = None) -> Tensor:
    r"""Convert a pair tensor to a sparse COO vector, a list of them to a batch.

    Args:
        pairs: a ``(k, 2)`` tensor of ``[index, value]`` rows (0-based indices,
            whole numbers), or a list of them, one per row of a batch.
        size (int, optional): the vector's length or the batch's width;
            by default the largest index + 1.

    Returns:
        A sparse COO tensor ``(size,)`` or ``(len(pairs), size)`` with the
        pairs' dtype and device.  Duplicate indices are kept (they sum).

    Raises:
        ValueError: a tensor that is not ``(k, 2)``, non-integer, negative or
            out-of-range indices, indices beyond the integers a float dtype
            holds exactly (float32 above 2**24, float16 above 2048, bfloat16
            above 256: build such pairs as float64), or rows on different devices.

    Example::

        >>> from_pairs(torch.tensor([[1., 3.], [3., 5.]]), size=5).to_dense()
        tensor([0., 3., 0., 5., 0.])
    """
    if isinstance(pairs, Tensor) and pairs.layout != torch.strided:
        raise TypeError(f"pairs must be a dense (k, 2) tensor or a list of them, "
                        f"got layout {pairs.layout}")
    if isinstance(size, (Tensor, np.ndarray)):  # a 0-d integer one, as torch's sizes take
        size = as_count("size", size, 0, must="non-negative")
    if size is not None and not is_int(size):
        # (rows, n), as densify takes it: from_pairs' size is the width alone
        shape = (f"; a batch's size is its width, from_pairs(pairs, {size[-1]!r})"
                 if isinstance(size, (tuple, list)) and len(size) == 2 else "")
        raise TypeError(f"size must be an int, got {type(size).__name__} {size!r}{shape}")
    if size is not None and size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    if size is not None:
        check_int64(int(size), "size", "a non-negative int")
    batch = as_sparse_batch(pairs, name="pairs", width=None if size is None else int(size),
                            empty="pass size=n to give it one")
    if not batch.is_vector:
        check_numel(batch.shape, "pairs", f"a batch of size {tuple(batch.shape)}"
                    + ("" if size is not None else " (its width is the largest index + 1)"))
    return batch.to_coo()
