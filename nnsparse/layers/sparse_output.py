"""A linear layer whose output is computed only where a sparse target has entries.

An autoencoder for collaborative filtering is trained on observed ratings
only: its loss reads the decoder's output at the target's specified entries
and nowhere else.  :class:`SparseOutputLinear` computes exactly those outputs
(a sampled dense-dense product, ``torch.sparse.sampled_addmm``) and
back-propagates through them only (sparse-dense products), so a training step
costs in proportion to the number of ratings, not to ``rows x out_features``.

The weight gradient needs the pattern in column-major order (one stable sort
of the batch's column indices).  It is built once per batch and cached on the
normalised batch (``SparseBatch.column_major_all``), so a ``SparseLinearBatch``
encoder reading the same ratings, the criterion and the optimiser in the
backward reuse it rather than sort again (see ``docs/sparse_batch.md``).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple, Union, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type

from .. import _double, _grad_origin, _index
from .._forms import (SparseBatch, SparseLike, _operand_dtype_hint, _sparse_coo, as_flag,
                      as_sparse_batch, compile_boundary)
from .._load import check_state_dict
from .._lua import WEIGHT_MEMBERS, LuaMembers
from .._kernels import _csr_rows_mm, _sampled_rows, _t_mm, _table_mm, _update_rows_of
from .._ops import SparseParts, sampled_parts
from ..values import _coo_with_values, _csr_with_values
from .linear import (_GRAD, _NOT_ROW_MAJOR, _STEP, _autocast_on, _check_layer_args,
                     _check_not_narrower, _check_parameters, _check_weight_bias, _dense_step,
                     _has_bias, _parameter, _parametrized_table, _record_update,
                     _refuse_recorded_update, _refuse_update_in_transform,
                     _refuse_update_misuse, _refuse_update_on_parts,
                     _refuse_update_parametrized, _sparse_grad_reaches,
                     _state_with_no_update, _state_without_update,
                     _weight_read_once, _weight_use, _with_sparse_grad)

__all__ = ["SparseOutputLinear", "sampled_linear"]


class _SampledLinear(torch.autograd.Function):
    """values[e] = dot(h[row[e]], weight[col[e]]) + bias[col[e]] and its gradients.

    ``update`` (a ``_rowopt.TableUpdate`` or None): the optimiser in the
    backward; the touched rows of ``weight`` are then updated in place from
    their gradient rows and ``weight`` gets no gradient (the bias a dense
    one).  ``pattern``: the distinct-position batch whose cached structures
    (``column_major_all``, ``column_major``, ``blocked_order``) are read.
    """

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def forward(h: Tensor, weight: Tensor, bias: Optional[Tensor], row: Tensor,
                col: Tensor, crow: Tensor, sparse_grad: bool, update: Any,
                pattern: SparseBatch) -> Tensor:
        # (half types: the sampled product runs in float32, the backward's bags in h's dtype)
        values = _sampled_rows(pattern, h, weight, crow, col)
        if bias is not None:
            values = values + bias.index_select(0, col)
        return values

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        h, weight, bias, row, col, crow, sparse_grad, update, pattern = inputs
        ctx.save_for_backward(h, weight, row, col, crow)
        ctx.has_bias = bias is not None
        ctx.sparse_grad = sparse_grad and update is None
        # plain objects on ctx: the optimiser in the backward and the cached structures
        ctx.pattern = pattern
        _record_update(ctx, weight, update)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        update = ctx.update
        use = _weight_use(ctx, update)  # step, skip, or hand autograd.grad the gradient
        if torch.is_grad_enabled():  # create_graph=True (or torch.func): differentiable
            return _sampled_backward_graph(ctx, grad, use)
        h, weight, row, col, crow = ctx.saved_tensors
        grad = grad.contiguous()
        out_features = weight.shape[0]
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # grad_h = S @ W, S the (rows, out) CSR of the incoming values: row r
            # is the weighted sum of W's rows col[e] over r's entries, which is
            # what embedding_bag computes (2-3x faster than a CSR product here).
            grad_h = _table_mm(ctx.pattern, col, weight, crow, grad)
        need_w, need_b = use == _GRAD, ctx.has_bias and ctx.needs_input_grad[2]
        if use == _STEP:  # after grad_h: it reads the weight before the step
            _update_rows_of(update, ctx.stepped.detach(), ctx.pattern, h, grad)
        if need_w and not ctx.sparse_grad:  # (with the optimiser in the backward: dense)
            # the dense gradient in one pass over every output column (no
            # distinct columns to count: no host synchronisation on a GPU)
            grad_w = _t_mm(row, col, grad, h, out_features, ctx.pattern)
            need_w = False
        if need_b:
            grad_b = _bias_grad(grad, col, ctx.pattern, out_features, ctx.sparse_grad)
        if need_w:
            # grad_W = S^T @ h, computed only for the columns the pattern touches.
            perm, cols, crow_t, row_t = ctx.pattern.column_major()
            touched = _csr_rows_mm(row_t, h, crow_t, grad.index_select(0, perm))
            grad_w = _grad_origin.mark_made(  # in range by construction
                _sparse_coo(cols.unsqueeze(0), touched, weight.shape, True))
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _sampled_backward_graph(ctx: Any, grad: Tensor, use: str) -> Tuple[Optional[Tensor], ...]:
    """:class:`_SampledLinear`'s gradients as differentiable products
    (:mod:`nnsparse._double`), for a backward that records its graph
    (``create_graph=True``, ``torch.func``): a second derivative through them is exact.
    ``use``: :func:`~nnsparse.layers.linear._weight_use`'s."""
    _refuse_recorded_update(ctx, use)
    h, weight, row, col, crow = ctx.saved_tensors
    need, pattern, out_features = ctx.needs_input_grad, ctx.pattern, weight.shape[0]
    grad_h = grad_w = grad_b = None
    if need[0]:  # S @ W, S the (rows, out) CSR of the incoming values
        grad_h = _double.mm(grad, weight, row, col, crow, pattern, ctx.sparse_grad)
    if use == _GRAD:  # S.T @ h; the touched rows only with sparse_grad, as nn.Embedding's
        grad_w = _double._table_grad(grad, h, row, col, crow, out_features, ctx)
    if ctx.has_bias and need[2]:
        grad_b = _bias_grad(grad, col, pattern, out_features, ctx.sparse_grad)
    return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _bias_grad(grad: Tensor, col: Tensor, pattern: SparseBatch, out_features: int,
               sparse_grad: bool) -> Tensor:
    """The bias gradient: the incoming values summed by output column, dense
    ``(out_features,)``, or with ``sparse_grad`` a COO vector over the touched
    columns only (``pattern``'s cached distinct columns).  Summed into an
    ``(out_features,)`` vector either way, an O(out_features) pass that needs no
    per-entry structure beyond ``col`` (a segment index over the column-major
    entries would be an O(nnz) tensor made again at every backward).
    Differentiable when grad mode is on (the in-place addition is into fresh zeros)."""
    summed = grad.new_zeros(out_features).index_add_(0, col, grad)
    if not sparse_grad:
        return summed
    cols = pattern.column_major()[1]
    return _grad_origin.mark_made(
        _sparse_coo(cols.unsqueeze(0), summed.index_select(0, cols), (out_features,), True))


def _pattern_structure(pattern: SparseLike, input: Tensor,
                       out_features: int) -> Tuple[SparseBatch, SparseBatch]:
    """The batch of ``pattern`` and the same with distinct positions, row-sorted.

    All of it comes from the pattern's cached structure: for a batch the
    encoder already read (or a trusted one), nothing is checked or built again.
    """
    if isinstance(pattern, Tensor) and pattern.layout == torch.strided:
        raise TypeError(f"pattern must be sparse, got a dense (strided) tensor of shape "
                        f"{tuple(pattern.shape)}; convert it with nnsparse.sparsify(pattern), "
                        "or a Lua (k, 2) pair vector with nnsparse.from_pairs(pattern)")
    _check_not_narrower(pattern, out_features, "pattern", "out_features")
    batch = as_sparse_batch(pattern, name="pattern", width=out_features, pairs=False,
                            bound="out_features")
    if batch.is_vector != (input.dim() == 1):
        raise ValueError("pattern must be a sparse vector for a 1-D input and a batch for a "
                         f"2-D input, got a {'vector' if batch.is_vector else 'batch'} "
                         f"for input of shape {tuple(input.shape)}")
    rows = 1 if input.dim() == 1 else input.shape[0]
    if batch.rows != rows:
        raise ValueError(f"pattern must have {rows} rows, as input, got {batch.rows}")
    # Duplicates mean a sum for the target; the estimate has one value per
    # position, so positions are made distinct (once per pattern: cached).
    distinct = batch.coalesce() if not batch.coalesced else batch
    return batch, distinct


@compile_boundary
def sampled_linear(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                   pattern: Optional[SparseLike] = None, sparse_grad: bool = False) -> Tensor:
    r"""``input @ weight.T + bias`` computed only at the entries of ``pattern``.

    The entries are computed by a sampled dense-dense product and the
    gradients from them only: ``grad_input = S @ weight`` and
    ``grad_weight = S.T @ input`` where ``S`` is the sparse gradient of the
    result, so no ``(rows, out_features)`` dense tensor is ever made.

    Args:
        input (Tensor): dense, shape ``(rows, in_features)`` or ``(in_features,)``.
        weight (Tensor): dense, shape ``(out_features, in_features)``.
        bias (Tensor, optional): dense, shape ``(out_features,)``.
        pattern: the positions to compute, in any accepted sparse form (COO,
            CSR, list of sparse vectors, pair tensors), shape
            ``(rows, out_features)`` (a vector for a 1-D ``input``).  Its values
            are ignored; duplicate positions of an uncoalesced COO tensor are
            computed once.  ``None`` gives the dense ``F.linear`` output.
        sparse_grad (bool): give ``weight`` a sparse gradient (hybrid COO, one
            sparse dimension over ``weight``'s rows, like ``nn.Embedding``'s)
            holding only the rows (output columns) the pattern touches, and
            ``bias`` a sparse COO gradient over the same columns.  Without a
            pattern every output is computed, so every row of ``weight`` and
            every bias entry is touched (none for an input of no rows), as by
            a pattern holding every entry; inside ``torch.func`` transforms, a
            backward under ``vmap``, ``torch.compile`` and ``torch.jit.trace``
            the gradients are then ``F.linear``'s dense ones.  With or without
            a pattern they are dense (the values ``sparse_grad=False`` gives)
            for a ``weight`` or ``bias`` read as a view of a tensor that
            requires grad (slices of one flat parameter vector, ``p.t()``:
            torch's view backwards cannot reshape a sparse gradient) or made by
            an operation other than elementwise products and sums
            (``torch.cat``, a dtype cast, a custom ``autograd.Function``, a
            division by a tensor that is not 0-d); a leaf keeps its sparse
            gradient, and so do the leaves of products, sums, ``1 - w`` and
            divisions by a number or a 0-d tensor.  Usable with
            :class:`nnsparse.optim.LazyAdam`, ``torch.optim.SparseAdam`` and
            ``torch.optim.SGD`` (without momentum or weight decay).

    Returns:
        A sparse tensor with exactly the positions of ``pattern``: CSR when
        ``pattern`` is CSR, coalesced COO otherwise (1-D for a vector), of
        shape ``(rows, out_features)``; for a coalesced COO or a CSR
        ``pattern``, built on ``pattern``'s own index tensors, so a criterion
        given ``pattern`` as the target pairs the entries for free.  Gradients
        flow to ``input``, ``weight`` and ``bias`` from its values only, in
        O(nnz): no ``(rows, out_features)`` tensor, forward or backward; they
        are differentiable again (``create_graph=True``), see
        ``docs/ecosystem.md``.

    Raises:
        TypeError: ``input``, ``weight`` or ``bias`` is not a dense tensor,
            ``sparse_grad`` is not a bool, or ``pattern`` is not a sparse form
            (a dense pattern is refused: it names :func:`nnsparse.sparsify`), or
            ``input`` is not floating-point while a ``pattern`` is given.
        ValueError: shapes, dtypes or devices disagree, or pattern indices are
            out of range.

    float16 and bfloat16: the sampled product is computed in float32 (torch
    has no kernel for them) and returned in the input's dtype; the gradients
    are computed in the input's dtype.

    Example::

        >>> h = torch.tensor([[1., 2.], [3., 4.]])
        >>> w = torch.tensor([[1., 0.], [0., 1.], [1., 1.]])
        >>> pattern = torch.tensor([[0., 1., 0.], [1., 0., 1.]]).to_sparse()
        >>> out = nnsparse.sampled_linear(h, w, torch.zeros(3), pattern)
        >>> out.indices(), out.values()
        (tensor([[0, 1, 1],
                [1, 0, 2]]), tensor([2., 3., 7.]))
    """
    sparse_grad = as_flag(sparse_grad, "sparse_grad")
    _check_weight_bias(weight, bias)  # (the layer checks its own parameters in forward)
    return _sampled_linear(input, weight, bias, pattern, sparse_grad)


def _sampled_linear(input: Tensor, weight: Tensor, bias: Optional[Tensor], pattern: Any,
                    sparse_grad: bool, update: Any = None) -> Tensor:
    """:func:`sampled_linear` on a checked weight and bias; ``update``: the layer's
    in-backward optimiser."""
    if not isinstance(input, Tensor) or input.layout != torch.strided:
        raise TypeError(f"input must be a dense tensor, got "
                        f"{input.layout if isinstance(input, Tensor) else type(input).__name__}")
    _refuse_update_in_transform(update, weight)
    if (pattern is not None and input.dtype != weight.dtype
            and input.is_floating_point() and weight.is_floating_point()
            and _autocast_on(input)):
        # AMP: a lower-precision input (an autocast GEMM's output) meets the sampled
        # product in the weight's dtype, as the custom operator does, in the layer and in
        # sampled_linear alike (F.linear takes under autocast what nn.Linear takes).
        # Autocast casts floating tensors only: an integer input is refused below, as
        # F.linear refuses it under autocast
        input = input.to(weight.dtype)
    if sparse_grad and torch.is_grad_enabled() and not _sparse_grad_reaches(weight, bias):
        sparse_grad = False  # (a view's gradient, a flat vector's slice's: dense, as F.linear's)
    if (update is not None and torch.is_grad_enabled() and weight.requires_grad
            and not weight.is_contiguous()):
        # the update steps the rows of weight in place, as a contiguous table (a weight
        # that gets no step, frozen or under no_grad, is read as it is)
        raise RuntimeError(_NOT_ROW_MAJOR.format(name=update.name))
    if input.dim() == 0 or input.shape[-1] != weight.shape[1]:
        got = input.shape[-1] if input.dim() else "a 0-d tensor"
        raise ValueError(f"input must have {weight.shape[1]} features (in_features), got {got}")
    # autocast: F.linear of a dense output (pattern=None) casts its operands itself
    amp = pattern is None and _autocast_on(input)
    for arg, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype and not amp:
            raise ValueError(f"{arg} must have input's dtype {input.dtype}, got {t.dtype}"
                             f"{_operand_dtype_hint(arg, t.dtype, input.dtype)}")
        if t is not None and t.device != input.device:
            raise ValueError(f"{arg} must be on input's device {input.device}, got {t.device}")
    if pattern is None:
        if update is not None and torch.is_grad_enabled() and weight.requires_grad:
            # every output computed: every row of weight stepped in the backward from its
            # dense gradient, as for a pattern holding every entry (none for no rows)
            return _dense_step(input, weight, bias, True, update)
        if sparse_grad and update is None and torch.is_grad_enabled():
            # every output of every row computed, as by a pattern holding every entry: every
            # row of weight (an output column; in_features == 0 too) and every bias entry
            # touched, none for no rows (F.linear's dense gradient, handed on as sparse)
            touched = math.prod(input.shape[:-1]) > 0
            weight = cast(Tensor, _with_sparse_grad(weight, touched))
            bias = _with_sparse_grad(bias, touched)
        return F.linear(input, weight, bias)
    if not input.is_floating_point():
        # torch's sampled product (sparse_sampled_addmm) has floating kernels only
        raise TypeError(f"input must be floating-point for a sparse pattern, got {input.dtype}; "
                        f"convert input and weight (.float()), or compute the dense output "
                        f"(pattern=None)")
    if input.dim() not in (1, 2):
        raise ValueError(f"input must have shape (rows, in_features) or (in_features,), "
                         f"got {tuple(input.shape)}")
    h = input.unsqueeze(0) if input.dim() == 1 else input
    if isinstance(pattern, Tensor) and pattern.device != h.device:  # before reading its indices
        raise ValueError(f"pattern must be on input's device {h.device}, got {pattern.device}")
    batch, distinct = _pattern_structure(pattern, input, weight.shape[0])
    row, col, crow = distinct.row, distinct.col, distinct.crow_indices()
    if row.device != h.device:
        raise ValueError(f"pattern must be on input's device {h.device}, got {row.device}")
    values = _SampledLinear.apply(  # type: ignore[no-untyped-call]
        h, weight, bias, row, col, crow, sparse_grad, update, distinct)
    return _with_pattern(values, pattern, batch, row, col)


def _with_pattern(values: Tensor, pattern: SparseLike, batch: SparseBatch, row: Tensor,
                  col: Tensor) -> Tensor:
    """The sparse result: ``values`` at the distinct positions ``(row, col)`` of ``pattern``.

    Built on ``pattern``'s own index tensors when its entries already are
    those positions (coalesced COO, CSR), so a criterion given ``pattern`` as
    the target reads the values one for one; and through
    :func:`~nnsparse.values._coo_with_values`, whose backward costs O(nnz)
    (torch's CSR constructor would back-propagate a dense ``(rows, out)`` tensor).
    The result carries the pattern's checked structure (trusted).
    """
    if batch.form == "csr":
        assert isinstance(pattern, Tensor)
        crow, col_index = _index.csr_indices(pattern)
        return _csr_with_values(crow, col_index, values, batch.shape, batch)
    if batch.form == "coo" and batch.coalesced and pattern.is_coalesced():  # type: ignore[union-attr]
        # (not batch.coalesced alone: a COO pattern requiring grad is coalesced by copy)
        assert isinstance(pattern, Tensor)
        return _coo_with_values(pattern._indices(), values,
                                (batch.width,) if batch.is_vector else batch.shape, batch)
    distinct = batch.coalesce()
    index = col.unsqueeze(0) if batch.is_vector else torch.stack([row, col])
    return _coo_with_values(index, values, (batch.width,) if batch.is_vector else batch.shape,
                            distinct)


class SparseOutputLinear(LuaMembers, nn.Linear):
    r"""``nn.Linear`` that, given a sparse pattern, computes its output only there.

    The decoder of a sparse autoencoder: in training, pass the target's
    pattern and get the outputs at the target's specified entries as a sparse
    tensor with that pattern (see :func:`sampled_linear`), which every nnsparse
    criterion accepts as the estimate; at inference, pass no pattern and get
    the dense output, as ``nn.Linear``.  Parameters, names, shapes and
    initialisation are ``nn.Linear``'s, so a ``state_dict`` loads into either.

    Args:
        in_features (int): size of each input row.
        out_features (int): size of each output row (the catalogue).
        bias (bool): learn an additive bias.  Default: ``True``.
        sparse_grad (bool): sparse gradients for ``weight`` and ``bias``,
            holding only the output columns a batch's pattern touched.  A dense
            output (no pattern) computes every output column, so it touches
            every row of ``weight`` and every bias entry (none for an input of
            no rows), as a pattern holding every entry does; inside
            ``torch.func`` transforms, a backward under ``vmap``,
            ``torch.compile`` and ``torch.jit.trace`` its gradients are
            ``F.linear``'s dense ones.  With or without a pattern they are
            dense (``sparse_grad=False``'s values) for a parametrized
            ``weight`` (``torch.nn.utils.parametrize``), and for a ``weight`` or
            ``bias`` read as a view of a tensor that requires grad or made by
            an operation other than elementwise products and sums, see
            :func:`sampled_linear` (a flat parameter vector's slices given to
            ``torch.func.functional_call``).  Default: ``False``.
        device (torch.device, optional), dtype (torch.dtype, optional): of the
            parameters, as ``nn.Linear``'s factory keywords.  Default: torch's.

    Shape:
        - input: ``(rows, in_features)`` or ``(in_features,)``, dense.
        - pattern: ``(rows, out_features)``, any accepted sparse form, or ``None``.
        - output: sparse with ``pattern``'s positions, or dense ``(rows, out_features)``.

    Raises (in ``forward``, besides :func:`sampled_linear`'s):
        TypeError: ``weight`` or ``bias`` was replaced by a non-dense tensor
            or ``None`` (the weight).
        ValueError: it was replaced by one of another shape than
            ``(out_features, in_features)`` or ``(out_features,)``, or the bias
            differs from the weight in dtype or device.

    Raises (in the constructor):
        TypeError: a size that is not an int, a flag that is not a bool, a
            ``dtype`` that is not floating point, a ``device`` that is not one.
        ValueError: a negative size, a weight beyond 2**63 bytes, an unknown
            device name.

    Example::

        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> decoder = nnsparse.SparseOutputLinear(4, 6)
        >>> target = torch.tensor([[0., 1, 0, 0, 0, 3], [2, 0, 0, 0, 0, 0]]).to_sparse()
        >>> out = decoder(torch.randn(2, 4), target)
        >>> out.layout, out._nnz()
        (torch.sparse_coo, 3)
        >>> decoder(torch.randn(2, 4)).shape
        torch.Size([2, 6])
    """

    _LUA_MEMBERS = WEIGHT_MEMBERS  # Lua members named in the AttributeError

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 sparse_grad: bool = False,
                 device: Optional[Union[torch.device, str, int]] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        in_features, out_features = _check_layer_args(in_features, out_features, bias,
                                                      sparse_grad, dtype, device)
        bias, sparse_grad = bool(bias), bool(sparse_grad)  # a numpy bool, checked, as a bool
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.sparse_grad = sparse_grad
        # the optimiser in the backward, set by nnsparse.optim.apply_optimizer_in_backward
        self._row_update: Any = None

    # a SparseParts is no Sequence[Tensor] (its size is a pair of ints), but mypy
    # deems the two pattern types overlapping
    @overload
    def forward(  # type: ignore[overload-overlap]
            self, input: Tensor, pattern: SparseParts) -> SparseParts: ...

    @overload
    def forward(self, input: Tensor, pattern: Optional[SparseLike] = None) -> Tensor: ...

    @compile_boundary
    def forward(self, input: Tensor, pattern: Union[SparseLike, SparseParts, None] = None
                ) -> Union[Tensor, SparseParts]:
        # before the weight is read: a parametrization runs at each read (spectral_norm
        # updates its buffers), and a refused call changes nothing
        _refuse_update_parametrized(self, self._row_update)
        with _weight_read_once(self):
            return self._forward(input, pattern)

    def _forward(self, input: Tensor, pattern: Union[SparseLike, SparseParts, None]
                 ) -> Union[Tensor, SparseParts]:
        _check_parameters(self, "weight",
                          _parameter(self, "weight", "(out_features, in_features)"),
                          (self.out_features, self.in_features), "(out_features, in_features)",
                          _parameter(self, "bias", "(out_features,)"))
        # assigned since __init__ checked it? (a numpy bool passes, used as its truth)
        as_flag(self.sparse_grad, "sparse_grad")
        _refuse_update_misuse(self, self._row_update, self.weight)
        # a parametrized weight gets dense gradients (torch's parametrizations refuse a
        # sparse one), as a view does (_sampled_linear: _sparse_grad_reaches)
        sparse_grad = self.sparse_grad and not _parametrized_table(self, "weight")
        if isinstance(pattern, SparseParts):
            # torch.compile's input path (docs/compile_amp.md): a custom operator
            # over plain tensors; returns a SparseParts with pattern's entries.
            _refuse_update_on_parts(self._row_update)
            return sampled_parts(input, self.weight, self.bias, pattern, self.sparse_grad)
        if sparse_grad:  # LazyAdam then trusts the sparse gradients this layer makes
            _grad_origin.watch(self, "weight")
            _grad_origin.watch(self, "bias")
        return _sampled_linear(input, self.weight, self.bias, pattern, sparse_grad,
                               self._row_update)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={_has_bias(self)}, sparse_grad={self.sparse_grad}")

    def __getstate__(self) -> Dict[str, Any]:
        return _state_without_update(self)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        _state_with_no_update(self, state)

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> "_IncompatibleKeys":
        """``nn.Module.load_state_dict``, checked whole first: a refused load changes nothing."""
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        return cast(_IncompatibleKeys,
                    super().load_state_dict(state_dict, strict=strict, assign=assign))
