"""Element-wise functions on the values of a sparse batch, keeping its pattern.

The output of :class:`nnsparse.SparseOutputLinear` is a sparse tensor holding
a network's outputs at the target's specified entries; an activation such as
``tanh`` applies to those values, and the unspecified entries stay
unspecified (they are not outputs that were computed as 0, they are outputs
that were not computed).  This is masked semantics: ``sigmoid`` maps a
specified 0 to 0.5 and leaves unspecified entries alone.

Sparse results are built by :func:`_coo_with_values` and
:func:`_csr_with_values`, not by torch's constructors: the backward of
``torch.sparse_csr_tensor`` turns the incoming gradient into a dense tensor of
the result's shape (``SparseCompressedTensorBackward0`` calls ``to_dense``),
which for a decoder's output is ``rows x catalogue`` per training step.  Ours
returns the gradient's values, O(nnz).  They also reuse the caller's index
tensors, so a criterion sees that an estimate shares its target's pattern
(an identity test, free) and reads its values one for one.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union, cast, overload

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type

from . import _index
from ._forms import (SparseBatch, SparseLike, _sparse_coo, _sparse_csr, as_sparse_batch, attach,
                     compile_boundary, is_int, is_real, real_float)
from ._load import check_state_dict
from ._ops import SparseParts

__all__ = ["values_map", "ValuesMap", "normalize"]


def _keys_of(indices: Optional[Tensor], crow: Optional[Tensor], col: Optional[Tensor],
             size: Sequence[int]) -> Tensor:
    """Row-major linear index of each entry of a COO (``indices``) or CSR pattern."""
    if indices is not None:
        if indices.shape[0] == 1:
            return indices[0]
        return indices[0] * size[1] + indices[1]
    assert crow is not None and col is not None  # CSR when indices is None
    return _csr_rows(crow, col, size[0]) * size[1] + col.to(torch.int64)


def _csr_rows(crow: Tensor, col: Tensor, rows: int) -> Tensor:
    """The int64 row index of each entry of a CSR pattern."""
    return _index.rows_from_crow(crow, col.shape[0])


def _sparse_entries(grad: Tensor) -> Tuple[Tensor, Tensor]:
    """Sorted, distinct linear indices of a sparse tensor and its values there."""
    if grad.layout != torch.sparse_coo and grad.layout != torch.sparse_csr:
        grad = grad.to_sparse_coo()  # type: ignore[no-untyped-call]
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce()  # a sum of sparse gradients arrives uncoalesced
        keys, values = _keys_of(grad._indices(), None, None, grad.shape), grad._values()
    else:
        keys = _keys_of(None, grad.crow_indices(), grad.col_indices(), grad.shape)
        values = grad.values()
    keys, order = torch.sort(keys)
    return keys, values[order]


class _SparseWithValues(torch.autograd.Function):
    """A sparse tensor on given index tensors whose values carry the gradient.

    Forward wraps ``values`` into a COO tensor on ``indices`` (coalesced, one
    value per distinct position, unless ``coalesced`` is False: positions may
    then repeat, and sum) or a CSR tensor on ``crow``/``col``.  Backward
    returns the gradient at those positions in O(nnz): the gradient's own
    values when it is sparse on the same index tensors (what ``.values()``
    sends back), a look-up by linear index when it is sparse on another
    pattern (``.to_dense()``'s backward, a sum of gradients), a gather when it
    is dense (the caller made it, e.g. a product with a dense tensor).
    """

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def forward(values: Tensor, indices: Optional[Tensor], crow: Optional[Tensor],
                col: Optional[Tensor], size: Tuple[int, ...], coalesced: bool = True) -> Tensor:
        if indices is not None:
            return _sparse_coo(indices, values, size, coalesced)
        assert crow is not None and col is not None  # CSR when indices is None
        return _sparse_csr(crow, col, values, size)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        indices, crow, col, size = inputs[1:5]
        ctx.save_for_backward(indices, crow, col)
        ctx.size, ctx.coalesced = size, inputs[5] if len(inputs) > 5 else True

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        indices, crow, col = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True (or torch.func): differentiable
            return _ValuesAt.apply(  # type: ignore[no-untyped-call]
                grad, indices, crow, col, ctx.size, ctx.coalesced), None, None, None, None, None
        return (_values_at(grad, indices, crow, col, ctx.size, ctx.coalesced),
                None, None, None, None, None)


class _ValuesAt(torch.autograd.Function):
    """:func:`_values_at` as a differentiable function of ``grad``: the backward of
    :class:`_SparseWithValues` when it records its graph (``create_graph=True``).

    Its own gradient puts the incoming ``(nnz,)`` values back on the pattern
    (:class:`_SparseWithValues` again, so every order is exact), in ``grad``'s
    layout: a dense ``grad`` gets a dense gradient (``grad`` was one already),
    a sparse one a sparse gradient on the pattern, O(nnz).
    """

    @staticmethod
    def forward(grad: Tensor, indices: Optional[Tensor], crow: Optional[Tensor],
                col: Optional[Tensor], size: Tuple[int, ...], coalesced: bool) -> Tensor:
        return _values_at(grad, indices, crow, col, size, coalesced)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        grad, indices, crow, col, size, coalesced = inputs
        ctx.save_for_backward(indices, crow, col)
        ctx.size, ctx.layout, ctx.coalesced = size, grad.layout, coalesced

    @staticmethod
    def backward(ctx: Any, values_grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        indices, crow, col = ctx.saved_tensors
        out = _SparseWithValues.apply(  # type: ignore[no-untyped-call]
            values_grad, indices, crow, col, ctx.size, ctx.coalesced)
        if ctx.layout == torch.strided:
            out = out.to_dense()
        elif ctx.layout != out.layout:  # (a CSR pattern's COO gradient, or the reverse)
            out = out.to_sparse_csr() if ctx.layout == torch.sparse_csr else out.to_sparse_coo()
        return out, None, None, None, None, None


def _values_at(grad: Tensor, indices: Optional[Tensor], crow: Optional[Tensor],
               col: Optional[Tensor], size: Sequence[int], coalesced: bool = True) -> Tensor:
    """``grad`` (dense or sparse, shape ``size``) read at the pattern's entries, in its order.

    ``coalesced=False``: the COO pattern may repeat a position; each of its entries
    reads ``grad`` at that position (a sparse ``grad``'s repeats summed there).
    """
    if grad.layout == torch.strided:
        if indices is not None:
            return grad[tuple(indices)]
        assert crow is not None and col is not None  # CSR when indices is None
        return grad[_csr_rows(crow, col, size[0]), col.to(torch.int64)]
    # a gradient on the pattern's own indices is read one for one, unless a position may
    # repeat in both (e.g. x.detach() of an uncoalesced x): its value there is the repeats' sum
    if (grad.layout == torch.sparse_coo and indices is not None
            and _index.same_view(grad._indices(), indices) and (coalesced or grad.is_coalesced())):
        return grad._values()
    if (grad.layout == torch.sparse_csr and crow is not None
            and _index.same_view(grad.crow_indices(), crow) and _index.same_view(grad.col_indices(), col)):
        return grad.values()
    keys, values = _sparse_entries(grad)
    ours = _keys_of(indices, crow, col, size)
    if keys.numel() == 0:
        return values.new_zeros(ours.shape[0])
    pos = torch.searchsorted(keys, ours).clamp_(max=keys.numel() - 1)
    return torch.where(keys[pos] == ours, values[pos], values.new_zeros(()))


def _coo_with_values(indices: Tensor, values: Tensor, size: Sequence[int],
                     pattern: Optional[SparseBatch] = None, coalesced: bool = True) -> Tensor:
    """A coalesced COO tensor on ``indices`` (distinct, sorted) with ``values``, O(nnz) backward.

    ``pattern``, the checked batch of exactly these indices, is attached to
    the result (trusted, its cached structures shared).  ``coalesced=False``:
    an uncoalesced tensor, whose positions may repeat (they sum).
    """
    # (an inference tensor's indices are copied: the backward saves them)
    out = _SparseWithValues.apply(  # type: ignore[no-untyped-call]
        values, _index.outside_inference(indices), None, None, tuple(size), coalesced)
    return out if pattern is None else attach(out, pattern)


def _csr_with_values(crow: Tensor, col: Tensor, values: Tensor, size: Sequence[int],
                     pattern: Optional[SparseBatch] = None) -> Tensor:
    """A CSR tensor on ``crow``/``col`` with ``values``, O(nnz) backward (see above).

    Inside a ``torch.func`` transform, where torch can hold no CSR tensor, a
    coalesced COO tensor of the same entries (same values, same order).
    """
    crow, col = _index.outside_inference(crow), _index.outside_inference(col)
    try:
        out = _SparseWithValues.apply(  # type: ignore[no-untyped-call]
            values, None, crow, col, tuple(size))
    except RuntimeError:
        # "Sparse CSR tensors do not have strides": functorch cannot wrap a CSR result
        # (nothing is attached to it there: see nnsparse._forms._key)
        if not _index.in_transform():
            raise
        index = torch.stack([_csr_rows(crow, col, size[0]), col.to(torch.int64)])
        return _coo_with_values(index, values, size)
    return out if pattern is None else attach(out, pattern)


# a SparseParts is no Sequence[Tensor] (its size is a pair of ints), but mypy deems
# the two input types overlapping (as for SparseOutputLinear.forward's pattern)
@overload
def values_map(  # type: ignore[overload-overlap]
        fn: Callable[[Tensor], Tensor], input: SparseParts) -> SparseParts: ...


@overload
def values_map(fn: Callable[[Tensor], Tensor], input: SparseLike) -> SparseLike: ...


@compile_boundary
def values_map(fn: Callable[[Tensor], Tensor], input: Union[SparseLike, SparseParts]
               ) -> Union[SparseLike, SparseParts]:
    r"""Apply an element-wise function to the specified values of a sparse batch.

    Args:
        fn: a function mapping a 1-D tensor of values to one of the same shape
            (``torch.tanh``, ``torch.sigmoid``, ``nn.ReLU()``, a lambda...).
        input: a sparse batch or vector (torch COO or CSR, a list of sparse
            vectors or of pair tensors), a :class:`~nnsparse.SparseParts`
            (the ``torch.compile`` input form, e.g. a compiled
            :class:`~nnsparse.SparseOutputLinear`'s output), or a dense tensor
            (then ``fn(input)`` is returned; a lone pair tensor counts as
            dense: wrap it in a list).

    Returns:
        ``input`` with ``fn`` applied to its values, with the same positions:
        a COO tensor stays COO (coalesced first when it was not, since
        ``fn`` of a sum of duplicates is not the sum of ``fn``), a CSR tensor
        stays CSR with the same indices, a list or pair form keeps its form
        (its repeated positions summed first, row by row in column order, as
        for COO; entries in their order when none repeats), a
        :class:`~nnsparse.SparseParts` stays one on the same ``crow``/``col``
        (its positions are distinct), which a compiled graph traces.
        Gradients flow to ``input``'s values only.

    Raises:
        TypeError: ``fn`` is not callable or returned no dense tensor, ``input`` is
            not a tensor or an accepted sparse form.
        ValueError: ``fn`` changed the number of values or their device.

    Example::

        >>> x = torch.tensor([[0., 2.], [-1., 0.]]).to_sparse()
        >>> y = nnsparse.values_map(torch.sigmoid, x)
        >>> y.indices(), y.values()
        (tensor([[0, 1],
                [1, 0]]), tensor([0.8808, 0.2689]))
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (a module or function), got {type(fn).__name__}")
    if isinstance(input, Tensor) and input.layout == torch.strided:
        # dense data (a dense decoder's output at inference); a lone (k, 2)
        # pair tensor cannot be told from a dense (rows, 2) batch: wrap it in a list
        return fn(input)
    return _keep_form(input, lambda values, rows_of: _mapped(fn, values))


#: ``fn(values, rows_of)`` of :func:`_keep_form`: new values for a batch's ``values``,
#: ``rows_of()`` giving their int64 row index and the number of rows when ``fn`` needs them.
_PatternFn = Callable[[Tensor, Callable[[], Tuple[Tensor, int]]], Tensor]


def _keep_form(input: Union[SparseLike, SparseParts], fn: _PatternFn
               ) -> Union[SparseLike, SparseParts]:
    """The sparse ``input`` (not dense) with its values replaced by ``fn``'s, in its form,
    on its pattern (see :func:`values_map`'s Returns): what :func:`values_map` and
    :func:`normalize` share.  ``fn`` sees the values of distinct positions (an uncoalesced
    input's repeats summed first) and, through ``rows_of``, their rows (the batch's own
    row index; a :class:`~nnsparse.SparseParts`' rows from its ``crow``, traceable)."""
    if isinstance(input, SparseParts):  # the compile path: plain tensors, distinct positions
        parts = input
        return parts.with_values(fn(parts.values, lambda: (
            _index.rows_from_crow(parts.crow, parts.col.shape[0]), parts.crow.shape[0] - 1)))
    batch = as_sparse_batch(input, name="input")
    if isinstance(input, Tensor) and input.layout == torch.sparse_csr:
        crow, col = _index.csr_indices(input)
        return _csr_with_values(crow, col, fn(batch.values, _rows_of(batch)), input.shape, batch)
    if batch.form != "coo":
        batch = _distinct(batch)
        return batch.with_values(fn(batch.values, _rows_of(batch)))
    assert isinstance(input, Tensor)
    if input.is_coalesced():
        # on the input's own indices: a criterion then sees the pattern unchanged
        return _coo_with_values(input._indices(), fn(batch.values, _rows_of(batch)), input.shape,
                                batch)
    batch = batch.coalesce()  # (a no-op when as_sparse_batch had to coalesce it)
    index = batch.col.unsqueeze(0) if batch.is_vector else torch.stack([batch.row, batch.col])
    shape = (batch.width,) if batch.is_vector else batch.shape
    return _coo_with_values(index, fn(batch.values, _rows_of(batch)), shape, batch)


def _rows_of(batch: SparseBatch) -> Callable[[], Tuple[Tensor, int]]:
    return lambda: (batch.row, batch.rows)


@overload
def normalize(  # type: ignore[overload-overlap]
        input: SparseParts, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> SparseParts: ...


@overload
def normalize(input: SparseLike, p: float = 2.0, dim: int = 1,
              eps: float = 1e-12) -> SparseLike: ...


@compile_boundary
def normalize(input: Union[SparseLike, SparseParts], p: float = 2.0, dim: int = 1,
              eps: float = 1e-12) -> Union[SparseLike, SparseParts]:
    r"""Divide each row of a sparse batch by its :math:`L_p` norm, as ``F.normalize``.

    For each row :math:`v` the specified values become
    :math:`v / \max(\lVert v \rVert_p, \epsilon)`; the unspecified entries stay
    unspecified (they are zeros, which add nothing to a norm).  This is
    ``torch.nn.functional.normalize(input.to_dense(), p, dim, eps)`` at the specified
    entries, without making the dense tensor: O(nnz) time and memory whatever the width.

    Args:
        input: a sparse batch, shape ``(rows, width)``: torch COO (coalesced or not) or
            CSR, a list of sparse vectors or of pair tensors, a
            :class:`~nnsparse.SparseParts` (the ``torch.compile`` form); or a sparse
            vector ``(width,)`` (COO), normalised whole.  A dense tensor is given to
            ``F.normalize`` (a lone pair tensor counts as dense: wrap it in a list).
            Floating-point or complex values.
        p (float): the exponent of the norm, ``> 0`` (``math.inf``: the largest
            ``|value|``).  Default: 2.
        dim (int): the dimension reduced: ``1`` or ``-1`` for a batch (each row on its
            own), ``0`` or ``-1`` for a vector, as torch numbers them (the default, 1, is
            out of range for a vector, as in ``F.normalize``).  Default: 1.
        eps (float): the smallest divisor, which keeps a row of zeros finite.
            Default: 1e-12.

    Returns:
        ``input``'s form, pattern, shape, dtype and device, as :func:`values_map`
        returns them (an uncoalesced COO tensor's repeated positions summed first).
        Gradients flow to ``input``'s specified values only (each value's gradient
        also comes through its row's norm); a row with no specified entry has no value.
        Half and bfloat16 norms are summed in float32, as torch's ``norm`` does.

    Raises:
        TypeError: ``input`` is not a tensor or an accepted sparse form, or has integer
            or bool values; ``p``, ``dim`` or ``eps`` is not a number.
        IndexError: ``dim`` is out of range for ``input``'s dimensions (as torch).
        NotImplementedError: ``dim=0`` of a batch (columns: normalise the transpose),
            ``p <= 0``.
        ValueError: ``p`` or ``eps`` is NaN, ``eps`` is negative.

    Example::

        >>> x = torch.tensor([[3., 0., 4.], [0., 0., 0.], [0., -2., 0.]]).to_sparse()
        >>> y = nnsparse.normalize(x)
        >>> y.indices(), y.values()
        (tensor([[0, 0, 2],
                [0, 2, 1]]), tensor([ 0.6000,  0.8000, -1.0000]))
        >>> nnsparse.normalize(x.to_sparse_csr(), p=1).values()
        tensor([ 0.4286,  0.5714, -1.0000])
    """
    p, dim, eps = _normalize_settings(p, dim, eps)
    if p <= 0:  # (a dense input too: F.normalize took p=-1, dividing by eps, 1e12 times)
        raise NotImplementedError(f"nnsparse.normalize takes p > 0 (a norm; math.inf for the "
                                  f"largest |value|), got p={p}")
    if isinstance(input, Tensor) and input.layout == torch.strided:
        _check_normalizable(input.dtype)  # (F.normalize's RuntimeError named no argument)
        ndim = max(input.dim(), 1)  # (torch reads a 0-d tensor as 1-D)
        if not -ndim <= dim < ndim:  # (torch's IndexError said "Dimension", not dim)
            raise IndexError(f"dim out of range for a {input.dim()}-D tensor (expected to be "
                             f"in range of [{-ndim}, {ndim - 1}]), got {dim}")
        return F.normalize(input, p=p, dim=dim, eps=eps)
    ndim = input.dim() if isinstance(input, Tensor) else 2
    if ndim <= 2:  # (a sparse tensor of more dimensions is refused by as_sparse_batch)
        if not -ndim <= dim < ndim:
            raise IndexError(f"dim out of range for a {ndim}-D sparse "
                             f"{'vector' if ndim == 1 else 'batch'} (expected to be in range "
                             f"of [{-ndim}, {ndim - 1}]), got {dim}")
        if ndim == 2 and dim % 2 == 0:
            raise NotImplementedError(
                f"nnsparse.normalize normalises rows (dim=1 or -1), got dim={dim} (columns): "
                f"normalise the transpose, or densify")
    return _keep_form(input, lambda values, rows_of: _row_normalized(values, rows_of, p, eps))


def _normalize_settings(p: Any, dim: Any, eps: Any) -> Tuple[float, int, float]:
    """:func:`normalize`'s ``p``, ``dim`` and ``eps`` checked whatever the input (its
    ``TypeError`` / ``ValueError``), as ``float``, ``int``, ``float`` (also the
    :class:`~nnsparse.Normalize` constructor's check)."""
    # (the house's number tests: numpy's ints and floats too, not a bool nor a timedelta64;
    # real_float: an int beyond float's range is infinite, not float()'s OverflowError)
    if not is_real(p):
        raise TypeError(f"p must be a number (the norm's exponent), got {type(p).__name__}")
    if not is_int(dim):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not is_real(eps):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    p, eps = real_float(p), real_float(eps)
    if math.isnan(p) or math.isnan(eps):
        raise ValueError(f"p and eps must not be NaN, got p={p}, eps={eps}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (the smallest divisor), got {eps}")
    return p, int(dim), eps


def _row_normalized(values: Tensor, rows_of: Callable[[], Tuple[Tensor, int]], p: float,
                    eps: float) -> Tensor:
    """``values`` divided by their row's p-norm clamped at ``eps`` (``F.normalize``'s
    ``x / x.norm(p).clamp_min(eps)``), the norms a segment reduction over the row index."""
    _check_normalizable(values.dtype)
    row, rows = rows_of()
    # half and bfloat16 sums in float32, as torch's norm (300 ** 2 overflows float16)
    wide = values.to(torch.float32) if values.dtype in _WIDENED else values
    size = wide if p == 2 and not wide.is_complex() else wide.abs()  # (squared: no abs)
    zeros = size.new_zeros(rows)
    if p == math.inf:
        norm = zeros.scatter_reduce(0, row, size, "amax", include_self=False)
    elif p == 1:
        norm = zeros.index_add(0, row, size)
    else:
        if p == 2:
            powered = size * size
        else:  # |0| ** p with p < 1 has an infinite slope: 0 there, as torch's norm has
            nonzero = size != 0  # (not > 0: a NaN value must make its row's norm NaN)
            powered = torch.where(nonzero, torch.where(nonzero, size, torch.ones_like(size))
                                  .pow(p), torch.zeros_like(size))
        total = zeros.index_add(0, row, powered)
        # the root at a zero row (0 ** (1/p): an infinite slope) gets gradient 0 through
        # the inner where, as torch's norm has there; the outer one gives its value, 0
        # (!= 0, not > 0: a row holding a NaN has a NaN norm and NaN values, as
        # F.normalize gives, not its other values divided by eps)
        some = total != 0
        safe = torch.where(some, total, torch.ones_like(total))
        norm = torch.where(some, safe.sqrt() if p == 2 else safe.pow(1 / p), zeros)
    if values.dtype in _WIDENED:  # back in the values' dtype before eps, as F.normalize
        norm = norm.to(values.dtype)
    return values / norm.clamp_min(eps).index_select(0, row)


_WIDENED = (torch.float16, torch.bfloat16)


def _check_normalizable(dtype: torch.dtype) -> None:
    """``TypeError`` unless :func:`normalize`'s input values are floating point or complex."""
    if not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"input must have floating-point or complex values (as F.normalize), "
                        f"got {dtype}")


def _distinct(batch: SparseBatch) -> SparseBatch:
    """``batch`` with its repeated positions summed (a list of uncoalesced vectors or of
    pair tensors that repeat an index): ``fn`` of a sum is not the sum of ``fn``.
    The batch itself, entries in their order, when no position repeats."""
    if batch.coalesced:
        return batch
    merged = batch.coalesce()
    return merged if merged.nnz != batch.nnz else batch


def _mapped(fn: Callable[[Tensor], Tensor], values: Tensor) -> Tensor:
    out = fn(values)
    if not isinstance(out, Tensor):
        raise TypeError(f"fn must return a Tensor, got {type(out).__name__}")
    if out.layout != torch.strided:  # a sparse tensor cannot be the values of one
        raise TypeError(f"fn must return a dense tensor of values, got layout {out.layout}")
    if out.shape != values.shape:
        raise ValueError(f"fn must keep the values' shape {tuple(values.shape)}, "
                         f"got {tuple(out.shape)}")
    if out.device != values.device:
        raise ValueError(f"fn must keep the values' device {values.device}, got {out.device}")
    return out


class ValuesMap(nn.Module):
    r"""Apply a module or function to a sparse batch's values, or to a dense tensor.

    Lets element-wise modules (``nn.Tanh``, ``nn.Sigmoid``, ``nn.Dropout``...)
    sit after a layer whose output is sparse, e.g. inside ``nn.Sequential``;
    a dense input is passed to ``fn`` unchanged, so the same network serves
    sparse (training) and dense (inference) outputs, and a
    :class:`~nnsparse.SparseParts` (a compiled decoder's output) gives a
    :class:`~nnsparse.SparseParts`.  See :func:`values_map`.

    Args:
        fn: an element-wise ``nn.Module`` (registered as a submodule) or callable.

    Shape:
        As :func:`values_map`: the output has the input's form, pattern and shape.

    Raises:
        TypeError: ``fn`` is not callable; in ``forward``, :func:`values_map`'s.

    Example::

        >>> act = nnsparse.ValuesMap(torch.nn.Tanh())
        >>> act
        ValuesMap(
          (fn): Tanh()
        )
        >>> act(torch.tensor([[0., 1.], [0., 0.]]).to_sparse()).values()
        tensor([0.7616])
        >>> act(torch.zeros(2))
        tensor([0., 0.])
        >>> nnsparse.ValuesMap(torch.sigmoid)
        ValuesMap(fn=sigmoid)
    """

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"fn must be callable (a module or function), got {type(fn).__name__}")
        self.fn = fn

    @compile_boundary
    def forward(self, input: Union[SparseLike, SparseParts]) -> Union[SparseLike, SparseParts]:
        return values_map(self.fn, input)

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> "_IncompatibleKeys":
        """``nn.Module.load_state_dict`` (the state of a module ``fn``), checked whole first:
        a refused load changes nothing (torch's copied the entries before the refused one)."""
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        return cast(_IncompatibleKeys,
                    super().load_state_dict(state_dict, strict=strict, assign=assign))

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # the constructor's check again: a file's fn (torch.load allows ValuesMap and plain
        # values) was set without it, and failed only at the first forward
        modules = state.get("_modules") or {}
        fn = modules["fn"] if "fn" in modules else state.get("fn")
        if not callable(fn):
            got = "no fn" if "fn" not in modules and "fn" not in state else type(fn).__name__
            raise TypeError(f"a loaded ValuesMap's fn must be callable (a module or function), "
                            f"got {got}")
        super().__setstate__(state)  # type: ignore[no-untyped-call]

    def extra_repr(self) -> str:
        # A module is shown as the child ``(fn): Tanh()``; a function by its name.
        if isinstance(self.fn, nn.Module):
            return ""
        name = getattr(self.fn, "__name__", None)
        return f"fn={name}" if isinstance(name, str) else f"fn={self.fn!r}"
