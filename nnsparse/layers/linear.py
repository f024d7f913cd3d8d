"""``SparseLinearBatch``: the ``nn.Linear`` of sparse input batches."""
from __future__ import annotations

import contextlib
import math
from typing import Any, ContextManager, Dict, List, Optional, Set, Tuple, Union, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type

from .. import _double, _grad_origin, _index, _rowopt
from .._forms import (_INT64_MAX, SparseBatch, SparseLike, _dtype_hint, _sparse_coo, as_choice,
                      as_device, as_flag, as_int, as_sparse_batch, compile_boundary, dtype_got,
                      empty_batch, int_dtype, move_structure, no_rows)
from .._load import check_state_dict
from .._lua import WEIGHT_MEMBERS, LuaMembers, member_error
from .._kernels import (_csr_rows_mm, _sampled_mm, _t_mm, _table_mm, _update_every_row,
                        _update_rows_of)
from .._ops import SparseParts, linear_parts

__all__ = ["SparseLinearBatch", "sparse_linear"]

_MODES = ("auto", "sparse", "dense")
# mode="auto" densifies the batch and runs a GEMM above these densities
# (nnz / (rows * in_features)), measured by benchmarks/bench_sparse_linear.py
# --crossover at in=6040, out=512, batch 128 (see the README).  CPU (2 cores): the
# sparse kernels win up to 20% density, the GEMM from 30%.  CUDA (H100): a step
# is launch-bound (about 1 ms either way) and the GEMM wins from about 0.3%; at
# in=480189 and 0.04% the sparse kernels are ahead again.
_DENSE_ABOVE = {"cpu": 0.25, "cuda": 0.002}


def _table_grad(row: Tensor, col: Tensor, values: Tensor, grad: Tensor, in_features: int,
                sparse: bool, pattern: SparseBatch) -> Tensor:
    """``S.T @ G``, the ``(in, out)`` gradient of the weight table.

    Dense: one ``embedding_bag`` with a bag per input column (empty bags give
    the zero rows), which writes the result in one pass.  Sparse: a coalesced
    hybrid COO tensor holding the touched columns only, as ``nn.Embedding``'s.
    """
    if not sparse:
        return _t_mm(row, col, values, grad, in_features, pattern)
    perm, cols, crow_t, row_t = pattern.column_major()
    touched = _csr_rows_mm(row_t, grad, crow_t, values.index_select(0, perm))
    # in range by construction: LazyAdam need not check it (nnsparse/_grad_origin.py)
    return _grad_origin.mark_made(
        _sparse_coo(cols.unsqueeze(0), touched, (in_features, grad.shape[1]), True))


class _SparseLinear(torch.autograd.Function):
    """``S @ table + bias`` for a row-grouped sparse batch ``S`` and a contiguous
    ``(in, out)`` table (the weight, transposed), and its gradients.

    ``update`` (a ``_rowopt.TableUpdate`` or None): the optimiser in the
    backward; the touched rows of ``table`` are then updated in place from
    their gradient rows and ``table`` gets no gradient.  ``pattern``: the
    batch whose cached structures (``column_major_all``, ``column_major``,
    ``blocked_order``) are read.
    """

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def forward(values: Tensor, table: Tensor, bias: Optional[Tensor], row: Tensor,
                col: Tensor, crow: Tensor, sparse_grad: bool, update: Any,
                pattern: SparseBatch) -> Tensor:
        out = _table_mm(pattern, col, table, crow, values)
        if bias is not None:
            out.add_(bias)
        return out

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        values, table, bias, row, col, crow, sparse_grad, update, pattern = inputs
        ctx.save_for_backward(values, table, row, col, crow)
        ctx.has_bias, ctx.sparse_grad = bias is not None, sparse_grad
        # plain objects on ctx: the optimiser in the backward and the cached structures
        ctx.pattern = pattern
        _record_update(ctx, table, update)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        update = ctx.update
        use = _weight_use(ctx, update)  # step, skip, or hand autograd.grad the gradient
        if torch.is_grad_enabled():  # create_graph=True (or torch.func): differentiable
            return _linear_backward_graph(ctx, grad, use)
        values, table, row, col, crow = ctx.saved_tensors
        grad = grad.contiguous()
        grad_values = grad_table = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Only at the specified entries: (G @ W)[row, col], never (rows, in).
            grad_values = _sampled_mm(grad, table.t(), crow, col)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
            if ctx.sparse_grad and update is None:  # SparseAdam wants sparse
                grad_bias = _grad_origin.mark_made(_bias_as_sparse(grad_bias, grad.shape[0]))
        if use == _STEP:
            _update_rows_of(update, ctx.stepped.detach(), ctx.pattern, grad, values)
        elif use == _GRAD:  # dense, as the in-backward mode gives the bias
            grad_table = _table_grad(row, col, values, grad, table.shape[0],
                                     ctx.sparse_grad and update is None, ctx.pattern)
        return grad_values, grad_table, grad_bias, None, None, None, None, None, None


def _record_update(ctx: Any, table: Tensor, update: Any) -> None:
    """Record on ``ctx``, at a layer's forward, the optimiser in the backward it may step
    (``update``, or ``None``): ``ctx.update``, its update count then (``ctx.updates``,
    which tells a backward whether the table changed since), and ``ctx.stepped``, the
    table the backward steps in place (``None`` without an optimiser); and watch the
    forward (:func:`_watch_forward`).

    ``ctx.stepped`` is the very tensor the forward read, the Parameter or its view, as a
    plain attribute.  What ``save_for_backward`` gives back is read (the input's
    gradient, before the step), never written: a ``saved_tensors_hooks`` pair may unpack
    a copy (``torch.autograd.graph.save_on_cpu`` on a GPU, an offloading or compressing
    hook), and the step would have updated that copy, lost, while the optimiser's state
    and step count advanced."""
    ctx.update = update
    ctx.updates = update.updates if update is not None else 0
    ctx.stepped = table if update is not None else None
    _watch_forward(ctx, update)


def _bias_as_sparse(grad_bias: Tensor, rows: int) -> Tensor:
    """The ``sparse_grad`` bias gradient: every output of a batch with rows is touched
    (each row's output adds the bias), so every entry is specified, zero or not; a
    batch of no rows touches none.  (``to_sparse()`` dropped the entries whose sum was
    exactly 0, a saturated unit's: a lazy optimiser then skipped them, moments and
    weight decay included, where Adam steps them.)"""
    return _every_row_as_sparse(grad_bias, rows > 0)


def _every_row_as_sparse(grad: Tensor, touched: bool) -> Tensor:
    """The dense ``grad`` as a coalesced COO tensor over its first dimension (hybrid for
    a 2-D ``grad``) specifying every row when ``touched``, none otherwise: the indices an
    ``arange``, in range by construction, no value read (no host synchronisation)."""
    n = grad.shape[0] if touched else 0
    index = torch.arange(n, device=grad.device).unsqueeze(0)
    return _sparse_coo(index, grad[:n].contiguous(), grad.shape, True)


class _EveryRowSparseGrad(torch.autograd.Function):
    """The identity on a ``sparse_grad`` layer's weight table or bias, whose backward hands
    the dense gradient it receives on as :func:`_every_row_as_sparse` gives it (marked:
    nnsparse/_grad_origin.py).  For a dense (strided) input, which specifies every entry:
    ``F.linear`` computes the products (leading dimensions, autocast, the input's gradient,
    double backward), and the parameters get the layouts the sparse kernels give a batch
    holding every entry explicitly (zeros included): every row of ``weight_t`` and every
    bias entry touched, none for a batch of no rows.  A backward under ``vmap`` (of a
    forward run outside it) hands the dense gradient on, batched; forward-mode AD passes
    the tangent through."""

    @staticmethod
    def forward(param: Tensor, touched: bool) -> Tensor:
        return param.view_as(param)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        ctx.touched = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], None]:
        if _batched(grad):  # a backward under vmap (is_grads_batched=True, vmap of
            return grad, None  # autograd.grad): no batched sparse tensor, dense as before
        return _grad_origin.mark_made(_every_row_as_sparse(grad, ctx.touched)), None

    @staticmethod
    def jvp(ctx: Any, param_t: Optional[Tensor], touched_t: Any) -> Optional[Tensor]:
        # forward-mode AD (a dual parameter): the identity's tangent, a view as the output is
        return None if param_t is None else param_t.view_as(param_t)


def _with_sparse_grad(param: Optional[Tensor], touched: bool) -> Optional[Tensor]:
    """``param`` through :class:`_EveryRowSparseGrad` where it will get a gradient, but
    inside a ``torch.func`` transform (``vmap``, ``jacrev`` and ``hessian`` batch the
    backward, and torch has no batched sparse tensors) and in a ``torch.compile`` region
    (dynamo traces no sparse constructor: ``fullgraph=True`` failed), and under
    ``torch.jit.trace`` (whose check of the trace failed on the Function): there the dense
    gradients ``F.linear`` gives, as before.  (A weight or bias that cannot take a sparse
    gradient, a view, never comes here: :func:`_sparse_grad_reaches` turned the call's
    ``sparse_grad`` off.)"""
    tracing = torch.jit.is_tracing()  # type: ignore[attr-defined, no-untyped-call]
    if (param is None or not param.requires_grad or _in_functorch() or tracing
            or torch.compiler.is_compiling()):
        return param
    return cast(Tensor, _EveryRowSparseGrad.apply(param, touched))  # type: ignore[no-untyped-call]


# The autograd nodes that hand a sparse gradient on correctly, as sparse (elementwise
# products and sums: pruning's ``weight_orig * weight_mask``, a scaled or summed weight).
# Views (view, reshape, slicing, select, t, expand, as_strided), casts (``.float()``) and
# ``torch.cat`` cannot take one (torch: "reshape is not implemented for sparse tensors").
# ``1 - w`` (Rsub) and ``w / c`` (Div) too, but torch's sparse division takes a 0-d divisor
# only ("Sparse division requires a scalar or zero-dim dense tensor divisor"): a Python
# number or a 0-d tensor, read by :func:`_takes_sparse_grad`.
# The ``*Backward1`` nodes are the ``.Scalar`` overloads (``aten.mul.Scalar`` and the like,
# which decompositions and compiled code call): a number times, plus or minus the gradient.
_TAKE_SPARSE_GRAD = frozenset({"MulBackward0", "AddBackward0", "SubBackward0",
                               "NegBackward0", "CloneBackward0", "RsubBackward0",
                               "MulBackward1", "AddBackward1", "SubBackward1",
                               "RsubBackward1", "DivBackward1"})
_SPARSE_PATH_NODES = 32  # the most such nodes walked; a larger graph gets dense gradients


def _takes_sparse_grad(node: Any) -> bool:
    """Whether the autograd ``node`` hands a sparse gradient on correctly:
    :data:`_TAKE_SPARSE_GRAD`'s, or a true division (``DivBackward0``) by a 0-d divisor
    (its saved ``other``: host metadata, no data read).  ``False`` (dense gradients, the
    same values) where the divisor cannot be looked at without running code: saved under
    saved-tensor hooks (``torch.utils.checkpoint``'s non-reentrant form, whose unpack
    recomputes the checkpointed function; ``save_on_cpu``, whose unpack copies the tensor
    back to its device), or a graph already freed by a backward (that backward's own
    error follows).  A Python number divisor is saved unpacked: ``w / 2`` stays sparse."""
    kind = type(node).__name__
    if kind in _TAKE_SPARSE_GRAD:
        return True
    if kind != "DivBackward0":
        return False
    try:
        if node._raw_saved_other.unpack_hook is not None:  # (a look, no hook run)
            return False
        return cast(bool, node._saved_other.dim() == 0)
    except (RuntimeError, AttributeError):  # "Trying to backward through the graph a
        return False  # second time ..."; a torch without the private accessors


def _sparse_grad_reaches(*tensors: Optional[Tensor]) -> bool:
    """Whether sparse gradients of ``tensors`` (a layer's weight and bias as its forward
    reads them) reach the tensors that keep them, their leaves, through autograd nodes
    that take sparse gradients: a leaf (a Parameter), or a tensor made from leaves by
    :func:`_takes_sparse_grad`'s nodes only.  Not a view of a tensor requiring grad (a
    slice of one flat parameter vector given to ``torch.func.functional_call``, ``p.t()``,
    a parametrization's output): its gradient must be dense.  Host-side graph metadata
    (``grad_fn``, ``next_functions``): no tensor read, no synchronisation; a leaf costs
    one attribute read.  In a ``torch.compile`` region: ``True`` unread, as dynamo
    traces no ``grad_fn`` (a graph break, which ``fullgraph=True`` refuses) and the region
    gives dense gradients anyway (:func:`_with_sparse_grad`; it traces no sparse batch)."""
    if torch.compiler.is_compiling():
        return True
    stack: List[Any] = [t.grad_fn for t in tensors if t is not None]  # (a leaf's: None)
    seen: Set[Any] = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen or type(node).__name__ == "AccumulateGrad":
            continue
        if not _takes_sparse_grad(node) or len(seen) == _SPARSE_PATH_NODES:
            return False
        seen.add(node)
        stack.extend(child for child, _ in node.next_functions)
    return True


def _in_functorch() -> bool:
    """Whether a ``torch.func`` transform is running (its private level; a torch without
    it: no)."""
    level = getattr(torch._C._functorch, "maybe_current_level", None)
    return level is not None and level() is not None


def _batched(grad: Tensor) -> bool:
    """Whether ``grad`` is a batch of gradients, one per vmap sample: a backward run under
    ``torch.func.vmap``, or ``torch.autograd.grad(..., is_grads_batched=True)`` (torch's
    legacy vmap; both private; a torch without them: no)."""
    legacy = getattr(torch._C._functorch, "is_legacy_batchedtensor", None)
    return _in_functorch() or (legacy is not None and bool(legacy(grad)))


class _DenseStep(torch.autograd.Function):
    """``F.linear`` of a dense (strided) input for a layer with the optimiser in the
    backward, whose backward steps every row of the weight (none for an input of no rows)
    from its dense gradient, as for the sparse batch holding every entry explicitly
    (:func:`~nnsparse._kernels._update_every_row`), and gives the weight no gradient (the
    bias a dense one, as the sparse kernels give it in this mode).

    ``weight``: the table the update steps, ``(in, out)`` (``SparseLinearBatch``'s
    ``weight_t`` or ``weight.t()``) or, ``out_major``, ``(out, in)``
    (``SparseOutputLinear``'s ``weight``).  Its input positions (input, weight, bias) are
    ``_SparseLinear``'s, so that :func:`_weight_use`, :func:`_watch_forward` and the
    refusals they make (stale, used twice, recorded) read it alike.  Under autocast the
    forward's product runs in the autocast dtype; the backward computes the gradients in
    the incoming gradient's dtype and returns each in its tensor's dtype, as autograd of
    ``F.linear`` gives them.
    """

    @staticmethod
    def forward(input: Tensor, weight: Tensor, bias: Optional[Tensor], out_major: bool,
                update: Any) -> Tensor:
        return F.linear(input, weight if out_major else weight.t(), bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        input, weight, bias, out_major, update = inputs
        ctx.save_for_backward(input, weight)
        ctx.has_bias, ctx.out_major = bias is not None, out_major
        ctx.bias_dtype = bias.dtype if bias is not None else None
        _record_update(ctx, weight, update)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        update = ctx.update
        use = _weight_use(ctx, update)  # step, skip, or hand autograd.grad the gradient
        if torch.is_grad_enabled():  # create_graph=True: refused where it would step
            _refuse_recorded_update(ctx, use)
        input, weight = ctx.saved_tensors
        w = weight if ctx.out_major else weight.t()  # (out, in)
        rows = math.prod(input.shape[:-1])  # (a width of 0 leaves -1 ambiguous)
        g = grad.reshape(rows, w.shape[0])
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # before the step: it reads the weight
            grad_input = (grad @ w.to(grad.dtype)).to(input.dtype)
        if use != _NONE:
            x = input.reshape(rows, w.shape[1]).to(grad.dtype)
            grad_weight = (g.t() @ x if ctx.out_major else x.t() @ g).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = g.sum(0).to(ctx.bias_dtype)
        if use == _STEP:
            assert grad_weight is not None
            _update_every_row(update, ctx.stepped.detach(), grad_weight.contiguous(),
                              rows > 0)
            grad_weight = None
        return grad_input, grad_weight, grad_bias, None, None


def _dense_step(input: Tensor, weight: Tensor, bias: Optional[Tensor], out_major: bool,
                update: Any) -> Tensor:
    """:class:`_DenseStep` of a checked input and weight (``SparseLinearBatch``'s table
    contiguous: the update writes it in place, as the sparse kernels' step needs it)."""
    if not out_major and not weight.is_contiguous():
        raise RuntimeError(_NOT_COLUMN_MAJOR.format(name=update.name))
    return cast(Tensor, _DenseStep.apply(  # type: ignore[no-untyped-call]
        input, weight, bias, out_major, update))


class _NoOutputs(torch.autograd.Function):
    """``SparseLinearBatch(in, 0, sparse_grad=True)``: the ``(rows, 0)`` output, whose
    weight and bias gradients are sparse COO (with no entries), as every ``sparse_grad``
    gradient is (``F.linear`` gave them dense: ``SparseAdam`` refused them); the input's
    values get zeros, as ``nn.Linear(in, 0)`` gives its input."""

    @staticmethod
    def forward(values: Tensor, table: Tensor, bias: Optional[Tensor], rows: int) -> Tensor:
        return values.new_zeros(rows, 0)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        values, table, bias, rows = inputs
        ctx.values_shape, ctx.table_shape, ctx.rows = values.shape, table.shape, rows
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        need = ctx.needs_input_grad
        grad_values = grad.new_zeros(ctx.values_shape) if need[0] else None
        grad_table = grad_bias = None
        if need[1]:
            index = torch.zeros(1, 0, dtype=torch.int64, device=grad.device)
            grad_table = _grad_origin.mark_made(
                _sparse_coo(index, grad.new_zeros(0, 0), ctx.table_shape, True))
        if ctx.has_bias and need[2]:
            grad_bias = _grad_origin.mark_made(_bias_as_sparse(grad.new_zeros(0), ctx.rows))
        return grad_values, grad_table, grad_bias, None


def _linear_backward_graph(ctx: Any, grad: Tensor, use: str) -> Tuple[Optional[Tensor], ...]:
    """:class:`_SparseLinear`'s gradients as differentiable products (:mod:`nnsparse._double`),
    for a backward that records its graph (``create_graph=True``, ``torch.func``):
    a second derivative through them is exact.  ``use``: :func:`_weight_use`'s."""
    _refuse_recorded_update(ctx, use)
    values, table, row, col, crow = ctx.saved_tensors
    need, pattern = ctx.needs_input_grad, ctx.pattern
    grad_values = grad_table = grad_bias = None
    if need[0]:  # (G @ W)[row, col], at the specified entries only
        grad_values = _double.sampled(grad, table, row, col, crow, pattern,
                                      ctx.sparse_grad and ctx.update is None)
    if ctx.has_bias and need[2]:
        grad_bias = grad.sum(0)
        if ctx.sparse_grad and ctx.update is None:  # as the fast path
            grad_bias = _bias_as_sparse(grad_bias, grad.shape[0])
    if use == _GRAD and ctx.update is not None:  # autograd.grad of the weight: dense
        grad_table = _double.t_mm(values, grad, row, col, crow, table.shape[0], pattern)
    elif use == _GRAD:  # S.T @ G; the touched rows only with sparse_grad, as nn.Embedding's
        grad_table = _double._table_grad(values, grad, row, col, crow, table.shape[0], ctx)
    return grad_values, grad_table, grad_bias, None, None, None, None, None, None


# What a layer's backward does with its weight (_weight_use): nothing (not asked for),
# its gradient (returned to autograd), or the in-backward optimiser's step.
_NONE, _GRAD, _STEP = "none", "grad", "step"


def _weight_use(ctx: Any, update: Any) -> str:
    """What the backward now running asks of the weight (input 1 of the layer's Function).

    Without the optimiser in the backward: its gradient when it requires one.  With it,
    the step is taken only where torch's engine will accumulate into the weight
    (``loss.backward()``, ``backward(inputs=[..., weight])``).  A backward that does
    not reach it (``torch.autograd.grad(loss, bias)``, ``backward(inputs=[bias])``, a
    gradient norm or penalty of other tensors) changes nothing and makes none of its
    gradient rows; ``torch.autograd.grad(loss, weight)`` gets its gradient, and no step.
    A step is refused, before any is taken, where a table of the optimiser is used
    twice in this backward (:func:`_refuse_used_twice`).
    """
    if not ctx.needs_input_grad[1]:
        return _NONE
    if update is None:
        return _GRAD
    if update.updates != ctx.updates:
        raise RuntimeError(update.stale_message())
    use = _engine_use(ctx.next_functions[1][0])
    if use == _STEP:
        _refuse_used_twice(update)
        recomputed_in = getattr(ctx, "recomputed_in", None)
        if recomputed_in is not None:  # (a reentrant checkpoint's nested backward)
            update.stepped_in = recomputed_in
    return use


def _watch_forward(ctx: Any, update: Any) -> None:
    """At a layer's training forward (one that may step ``update``'s table): keep its
    node (``TableUpdate.watch``); and where the forward runs inside a backward (a
    ``torch.utils.checkpoint`` recomputing it), refuse it if that backward uses a table
    twice.

    Under ``use_reentrant=True`` the recomputed layer's backward runs in a nested
    backward, whose engine knows nothing of the enclosing graph: a table used twice
    there (an encoder on two batches, the decoder checkpointed) is asked of here, of the
    enclosing backward, before the nested one steps anything; and a layer recomputed
    again in a backward that already stepped it from a recomputation (called in two
    reentrant checkpoints) is refused as stale (``TableUpdate.stepped_in``, set by
    :func:`_weight_use`).  The task id is torch's private
    ``torch._C._current_graph_task_id`` (-1 outside a backward), looked up as
    :func:`_engine_use` looks up its call; a torch without it is not checked.
    """
    if update is None or not ctx.needs_input_grad[1]:
        return
    update.watch(ctx)
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    task = task_id() if task_id is not None else -1
    if task == -1:
        return
    ctx.recomputed_in = task
    if update.stepped_in == task:
        raise RuntimeError(update.stale_message())
    _refuse_used_twice(update, steps=False)


def _refuse_used_twice(update: Any, steps: bool = True) -> None:
    """``RuntimeError`` where the backward now running would step a table of ``update``'s
    optimiser (``update.group``) from two of its layer's forwards: one layer used twice in
    one graph (``crit(dec(h1, x1), x1) + crit(dec(h2, x2), x2)``, an encoder applied to two
    batches, or two batches' losses summed).  Each use's backward would take a step of its
    own, where ``torch.optim`` takes one on the summed gradient.

    Asked at the backward of every layer that is about to step (``steps``), so the first
    of them refuses before any table of the optimiser has moved, and at a training
    forward recomputed inside a backward (:func:`_watch_forward`; ``steps=False``: whether
    its own table steps is asked of the engine, as for the others).  A table keeps the
    nodes of its training forwards since its last step (``TableUpdate.nodes``, weakly;
    usually one): with fewer than two nothing is asked; otherwise torch's engine is
    asked, on the host, which of them this backward runs
    (``torch._C._will_engine_execute_node``, as in :func:`_engine_use`; a forward whose
    output is never differentiated, or one of another graph, does not run).  A torch
    without it is not checked: the second use's backward is then refused after the first
    one's step, as ``updates`` tells it.
    """
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if will_execute is None:
        return
    twice: Dict[str, int] = {}  # name -> uses
    for table in update.group:
        nodes = table.nodes
        if len(nodes) < 2:
            continue
        running = [node for node in _rowopt.alive(nodes)  # (another thread may add one)
                   if node.needs_input_grad[1] and _will_run(will_execute, node)]
        if len(running) > 1 and ((table is update and steps) or  # (_weight_use asked)
                                 _engine_use(running[0].next_functions[1][0]) == _STEP):
            twice[table.name] = len(running)
    if twice:  # (this layer named first)
        raise RuntimeError(_used_twice_message(dict(sorted(
            twice.items(), key=lambda item: item[0] != update.name))))


def _will_run(will_execute: Any, node: Any) -> bool:
    """Whether the running backward executes the autograd ``node`` of a layer's forward."""
    try:
        return bool(will_execute(node))
    except RuntimeError:  # (not asked of a leaf: a layer's node never is one)
        return False


def _used_twice_message(twice: Dict[str, int]) -> str:
    """``twice``: the layers used more than once, name -> uses (the first one named)."""
    (name, uses), *others = twice.items()
    also = "".join(f"; so is {other} ({n} times)" for other, n in others)
    return (f"{name}: this layer is used {uses} times in the graph this backward runs (called "
            f"on several batches, or several batches' losses summed, before one backward"
            f"{also}), and the optimiser in the backward (nnsparse.optim."
            f"apply_optimizer_in_backward) steps a weight in the backward of each use: "
            f"{uses} steps, each from one use's gradient, where torch.optim takes one step "
            f"on their sum. Refused before any layer of this optimiser stepped (parameters "
            f"nearer the loss than every sparse layer, a dense head, may hold this "
            f"backward's gradient in .grad, which zero_grad() drops). Call the layer once on "
            f"the batches concatenated along the "
            f"rows (torch.cat([x1, x2]), sparse COO batches too; a SparseOutputLinear's "
            f"inputs and patterns alike), or train a weight used twice with torch.optim or "
            f"nnsparse.optim.LazyAdam (call remove() on the in-backward optimiser)")


def _engine_use(node: Any) -> str:
    """Whether the running backward accumulates into the weight behind the autograd
    ``node`` of a layer's weight input (``_STEP``), captures its gradient for
    ``torch.autograd.grad`` (``_GRAD``), or does not reach it (``_NONE``).

    The one place nnsparse asks torch's engine: ``torch._C._will_engine_execute_node``
    is private (torch's public ``torch.autograd.graph.register_multi_grad_hook`` is built
    on it), so it is looked up, and where it is missing or answers otherwise than torch
    2.x does, the step is taken, as before it was asked.  It reads the graph task's
    execution plan on the host: no tensor is read, no device synchronised.  For a leaf
    whose gradient ``torch.autograd.grad`` captures it raises ("A leaf node was passed
    to _will_engine_execute_node but we are currently running autograd.grad()"): that
    is the request of the weight's own gradient.
    """
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    # SparseLinearBatch hands the kernel weight.t(), and weight_t.t().t() when a layer
    # built with sparse_grad=True is set to sparse_grad=False (its weight is weight_t's
    # view): ask about the parameter behind the transposes, the node autograd.grad captures
    while node is not None and type(node).__name__ == "TBackward0":
        node = node.next_functions[0][0]
    if will_execute is None or node is None:
        return _STEP
    try:
        return _STEP if will_execute(node) else _NONE
    except RuntimeError as error:
        if "leaf node" in str(error) and "autograd.grad" in str(error):
            return _GRAD
        return _STEP


def _refuse_recorded_update(ctx: Any, use: str) -> None:
    """The recorded backward (create_graph=True) of a layer with the optimiser in the
    backward: refused where it would step the weight, or where it records a gradient
    of the layer's input, which reads the weight: a later backward through it would
    give the weight a ``.grad`` that no optimiser applies."""
    update = ctx.update
    if update is None or not ctx.needs_input_grad[1]:
        return
    if use == _STEP:
        raise RuntimeError(_double_backward_refused(update.name))
    if ctx.needs_input_grad[0] and _engine_use(ctx.next_functions[0][0]) != _NONE:
        raise RuntimeError(
            f"{update.name}: a gradient recorded with create_graph=True through this "
            f"layer's input reads its weight, which the optimiser in the backward (nnsparse."
            f"optim.apply_optimizer_in_backward) updates in place: a backward through that "
            f"gradient (a gradient penalty) would give the weight a .grad that no optimiser "
            f"applies. create_graph=True works here for the gradients of this layer's bias "
            f"and weight and of parameters nearer the loss; otherwise call remove() on the "
            f"in-backward optimiser and train with torch.optim or nnsparse.optim.LazyAdam")


def _double_backward_refused(name: str) -> str:
    """Why a layer with the optimiser in the backward takes no step in a recorded backward."""
    return (f"{name}: a backward that records its graph (create_graph=True: a gradient "
            f"penalty, a Hessian-vector product, torch.autograd.functional.hessian) and "
            f"accumulates into this layer's weight (loss.backward(create_graph=True)) cannot "
            f"run with the optimiser in the backward (nnsparse.optim."
            f"apply_optimizer_in_backward), which updates the weight in place during the "
            f"backward and gives it no gradient to differentiate again; take such gradients "
            f"with torch.autograd.grad (of this weight too: it is then returned, not "
            f"stepped), or call remove() on the in-backward optimiser and train with "
            f"torch.optim or nnsparse.optim.LazyAdam")


def _density(batch: SparseBatch) -> float:
    return batch.nnz / max(1, batch.rows * batch.width)


def _use_dense(batch: SparseBatch, mode: str) -> bool:
    if mode != "auto":
        return mode == "dense"
    return _density(batch) > _DENSE_ABOVE.get(batch.device.type, _DENSE_ABOVE["cuda"])


@compile_boundary
def sparse_linear(input: SparseLike, weight: Tensor, bias: Optional[Tensor] = None, *,
                  mode: str = "auto") -> Tensor:
    r"""``input @ weight.T + bias`` for a sparse ``input``, never densifying it.

    Args:
        input: a sparse batch ``(rows, in_features)`` in any accepted form (COO,
            coalesced or not; CSR; a list of sparse vectors or of ``(k, 2)``
            pair tensors), a sparse vector ``(in_features,)``, or a dense
            (strided) tensor, always read as dense (then this is
            ``F.linear``): a lone Lua pair vector goes through
            :func:`nnsparse.from_pairs`.
        weight (Tensor): dense, shape ``(out_features, in_features)``.  Its
            gradient is ``G.T @ input``, non-zero on the touched columns only.
            The kernels read ``weight.t()``; when that is not contiguous (it
            is for :class:`SparseLinearBatch`'s weight) each call copies it.
        bias (Tensor, optional): dense, shape ``(out_features,)``.
        mode (str): ``"sparse"`` (sparse products), ``"dense"`` (densify the
            batch, then a GEMM: faster for dense batches or on a GPU), or
            ``"auto"``: dense above a measured density, see the README.

    The input's values get a gradient, when they require one, at their
    specified entries only: ``(G @ weight)[row, col]``.  When they do not,
    that product is skipped.  The gradients are differentiable again
    (``create_graph=True``: gradient penalties, Hessian-vector products),
    except with the optimiser in the backward: see ``docs/ecosystem.md``.

    Returns:
        A dense tensor ``(rows, out_features)``, or ``(out_features,)`` for a vector.

    Raises:
        TypeError: ``input`` is not an accepted form, ``weight`` or ``bias``
            is not a dense tensor, or ``weight`` is not floating-point while
            ``input`` is sparse (in every ``mode``; a dense ``input`` is
            ``F.linear``'s, which multiplies integer tensors on the CPU), or
            ``mode`` is not a str.
        ValueError: ``weight`` is not 2-D, ``bias`` is not ``(out_features,)``
            or differs from ``weight`` in dtype or device, a torch sparse
            ``input`` whose width is not ``in_features`` (a list of rows may
            be narrower), an index
            is out of range, input and weight differ in device or dtype, or
            ``mode`` is unknown.

    Example::

        >>> w = torch.tensor([[1., 2., 3.], [0., 1., 0.]])
        >>> x = torch.tensor([[0., 2., 0.], [1., 0., 1.]]).to_sparse()
        >>> nnsparse.sparse_linear(x, w, torch.tensor([0.5, 0.5]))
        tensor([[4.5000, 2.5000],
                [4.5000, 0.5000]])
    """
    _check_weight_bias(weight, bias)
    return _linear_table(input, weight.t(), bias, mode, sparse_grad=False)


def _autocast_on(t: Tensor) -> bool:
    """Whether autocast is on for ``t``'s device (``False`` on the meta device, for which
    torch has no autocast state: it raises for the question)."""
    return t.device.type != "meta" and torch.is_autocast_enabled(t.device.type)


def _linear_table(input: SparseLike, table: Tensor, bias: Optional[Tensor], mode: str,
                  sparse_grad: bool, update: Any = None) -> Tensor:
    """:func:`sparse_linear` on the weight's transpose ``table`` ``(in, out)``;
    ``update``: the layer's in-backward optimiser (forces the sparse kernels)."""
    as_choice(mode, "mode", _MODES)
    _refuse_update_in_transform(update, table)
    if sparse_grad and torch.is_grad_enabled() and not _sparse_grad_reaches(table, bias):
        sparse_grad = False  # (a view's gradient, a flat vector's slice's: dense, as F.linear's)
    if isinstance(input, Tensor) and input.layout == torch.strided:
        # a strided tensor is always dense (nn.Linear's behaviour): the Lua pair
        # form comes as a list of (k, 2) tensors or through nnsparse.from_pairs
        if input.dim() == 0 or input.shape[-1] != table.shape[0]:
            n = table.shape[0]
            # EmbeddingBag's (bags, k) input of indices is what a one-hot or bag-of-words
            # user has at hand: say how it becomes a sparse batch (COO: unsorted and
            # repeated indices allowed, repeats summed as mode="sum" does)
            bag = (f"; an integer (rows, k) tensor of column indices (nn.EmbeddingBag's 2-D "
                   f"input) becomes a batch with torch.sparse_coo_tensor(torch.stack(["
                   f"torch.arange(rows, device=input.device).repeat_interleave(k), "
                   f"input.flatten()]), weights.flatten(), (rows, {n})), weights its "
                   f"per_sample_weights or torch.ones(rows, k, device=input.device) (repeated "
                   f"indices summed, as mode='sum')"
                   if input.dim() == 2 and int_dtype(input.dtype) else "")
            raise ValueError(f"input must have {n} features (in_features) in its "
                             f"last dimension, got shape {tuple(input.shape)}; a Lua (k, 2) "
                             f"pair vector goes through nnsparse.from_pairs(input, "
                             f"size={n}){bag}")
        if input.device != table.device:
            raise ValueError(f"input must be on the weight's device {table.device}, "
                             f"got {input.device}")
        if input.dtype != table.dtype and not _autocast_on(input):
            raise ValueError(f"input must have the weight's dtype {table.dtype}, "
                             f"got {input.dtype}{_dtype_hint(input.dtype, table.dtype)}")
        if (update is not None and torch.is_grad_enabled() and table.requires_grad
                and table.shape[1] > 0):
            # every entry specified: every row of the table stepped in the backward from
            # its dense gradient, as for the sparse batch holding every entry (none for no
            # rows; no outputs: F.linear, as the sparse batch gets)
            return _dense_step(input, table, bias, False, update)
        if sparse_grad and update is None and torch.is_grad_enabled():
            # every entry specified: every row of the table and of the bias touched (none
            # for no rows; the table's none for no outputs, as _NoOutputs gives)
            rows = math.prod(input.shape[:-1])
            table = cast(Tensor, _with_sparse_grad(table, rows > 0 and table.shape[1] > 0))
            bias = _with_sparse_grad(bias, rows > 0)
        return F.linear(input, table.t(), bias)
    _check_not_narrower(input, table.shape[0], "input", "in_features")
    if isinstance(input, Tensor) and input.device != table.device:  # before reading its indices
        raise ValueError(f"input must be on the weight's device {table.device}, got {input.device}")
    if not table.is_floating_point():
        # the sparse kernels (embedding_bag) take floating tables only: refused in every
        # mode, so that mode="auto" does not work or fail by the batch's density
        raise TypeError(f"weight must be floating-point for a sparse input, got "
                        f"{table.dtype}; convert it (weight.float()) or multiply "
                        f"nnsparse.densify(input) with F.linear")
    if (isinstance(input, Tensor) and input.dtype != table.dtype
            and input.dtype.is_floating_point and _autocast_on(input)):
        # AMP: a lower-precision sparse batch (e.g. Sparsify of an autocast GEMM's output)
        # is read in the weight's dtype, as the custom operator does, by the layer and by
        # sparse_linear alike (F.linear takes under autocast what nn.Linear takes).  The
        # user's tensor is checked once, then the cast keeps its checked structure
        as_sparse_batch(input, name="input", width=table.shape[0], bound="in_features")
        input = move_structure(input, input.to(table.dtype))
    if no_rows(input):
        # an empty list of rows holds no dtype nor device: the layer's (as_sparse_batch
        # made it float32 on the CPU, which a float64 or CUDA layer refused)
        input = empty_batch(table.shape[0], table)
    batch = as_sparse_batch(input, name="input", width=table.shape[0], bound="in_features")
    if batch.device != table.device:
        raise ValueError(f"input must be on the weight's device {table.device}, "
                         f"got {batch.device}")
    if batch.dtype != table.dtype:
        raise ValueError(f"input must have the weight's dtype {table.dtype}, got {batch.dtype}"
                         f"{_dtype_hint(batch.dtype, table.dtype)}")
    if table.shape[1] == 0:
        # no output features (nn.Linear(in, 0)): torch's row kernels take no empty rows;
        # a (rows, 0) product keeps the weight and bias in the graph (zero gradients)
        if sparse_grad and update is None:
            out = cast(Tensor, _NoOutputs.apply(  # type: ignore[no-untyped-call]
                batch.values, table, bias, batch.rows))
        else:  # (+ an empty sum: the input's values get zeros, as from nn.Linear(in, 0))
            out = F.linear(batch.values.new_zeros(batch.rows, 0), table[:0].t(), bias) \
                + batch.values[:0].sum()
    elif not sparse_grad and update is None and _use_dense(batch, mode):
        dense = batch.values.new_zeros(batch.shape).index_put(
            (batch.row, batch.col), batch.values, accumulate=True)
        out = F.linear(dense, table.t(), bias)
    else:
        # sorted_by_row and crow_indices are cached on the batch's pattern:
        # built once per batch, whoever asks first.
        batch = batch.sorted_by_row()
        if (update is not None and torch.is_grad_enabled() and table.requires_grad
                and not table.is_contiguous()):
            # the update writes the rows of ``table`` in place: a copy would lose it (a
            # weight that gets no step, frozen or under no_grad, is read as it is, as
            # _refuse_update_misuse lets it pass)
            raise RuntimeError(_NOT_COLUMN_MAJOR.format(name=update.name))
        out = _SparseLinear.apply(  # type: ignore[no-untyped-call]
            batch.values, table.contiguous(), bias, batch.row, batch.col,
            batch.crow_indices(), sparse_grad, update, batch)
    return out.squeeze(0) if batch.is_vector else out


_NOT_COLUMN_MAJOR = (
    "{name}: the optimiser in the backward updates the weight in place and needs it stored "
    "as the layer made it (weight.t() contiguous); it holds another layout (a new Parameter "
    "assigned, or weight.data replaced, as prune.remove does): restore the layout in place, "
    "the same Parameter, with `with torch.no_grad(): layer.weight.data = "
    "layer.weight.t().contiguous().t()`, and load values later by copying them in "
    "(`layer.weight.copy_(w)`) rather than assigning")
# SparseOutputLinear's table is its (out, in) weight itself: the row update reads and writes
# it as a contiguous table, and torch's fused CPU Adam and Adagrad kernels step a strided
# parameter wrong (each element from another element's gradient and state)
_NOT_ROW_MAJOR = (
    "{name}: the optimiser in the backward updates the weight in place and needs it stored "
    "as the layer made it (weight contiguous, row-major (out_features, in_features)); it "
    "holds another layout (a new Parameter assigned, or weight.data replaced by a "
    "transposed tensor): restore the layout in place, the same Parameter, with `with "
    "torch.no_grad(): layer.weight.data = layer.weight.contiguous()`, and load values "
    "later by copying them in (`layer.weight.copy_(w)`) rather than assigning")


def _state_without_update(module: nn.Module) -> Dict[str, Any]:
    """``nn.Module.__getstate__`` of a sparse layer, without its optimiser in the backward.

    A pickled, saved or deep-copied layer is a layer alone, as a module is for
    ``torch.optim``: the copy of an attached layer would otherwise be updated in
    its backward by a copy of the optimiser no one holds (its weight getting no
    gradient from any other optimiser), and ``torch.load(weights_only=True)``
    would refuse the optimiser's class.  An :class:`~nnsparse.optim.InBackwardOptimizer`
    pickled or copied with its model attaches itself to the copy's layers again.
    """
    state: Dict[str, Any] = nn.Module.__getstate__(module)  # type: ignore[no-untyped-call]
    state["_row_update"] = None
    return state


def _state_with_no_update(module: nn.Module, state: Dict[str, Any]) -> None:
    """``nn.Module.__setstate__`` of a sparse layer, never with an optimiser in the backward.

    :func:`_state_without_update` wrote none; a file read by ``torch.load(weights_only=True)``
    (the layers are allow-listed) may hold any allowed object there, which forward and
    backward would have called as the optimiser (one without ``param`` skipped the check
    that it steps this layer's weight).  An optimiser unpickled with its layers attaches
    itself afterwards, as before.
    """
    nn.Module.__setstate__(module, state)  # type: ignore[no-untyped-call]
    module.__dict__["_row_update"] = None


def _refuse_update_in_transform(update: Any, weight: Tensor) -> None:
    """The optimiser in the backward writes the layer's weight in place: not inside a
    ``torch.func`` transform, whose tensors have no storage of their own to write
    (there torch refuses the write, naming a "captured Tensor", or would update
    a tensor that is not the layer's weight)."""
    if update is not None and _index.data_ptr(weight) is None:
        raise NotImplementedError(
            f"{update.name}: the optimiser in the backward (nnsparse.optim."
            f"apply_optimizer_in_backward) updates the weight in place during the backward, "
            f"which a torch.func transform (grad, grad_and_value, vjp, jacrev, vmap) cannot "
            f"do: there the weight is the transform's tensor, not the layer's. Train with "
            f"ordinary autograd (loss.backward()), or call remove() on the in-backward "
            f"optimiser before using torch.func")


def _refuse_update_misuse(layer: nn.Module, update: Any, read: Tensor) -> None:
    """Raise, from a training forward, where the optimiser in the backward would step
    something other than the weight it was built on, or steps inside ``DistributedDataParallel``.

    ``read`` is the tensor the forward reads as the weight table.  It must be the very
    Parameter the layer's in-backward table was built on (or a view of it): O(1), by
    identity, no host synchronisation.  Otherwise the update would write a temporary
    (pruning's ``weight_orig * mask``, a tensor given to ``torch.func.functional_call``) or
    another parameter with this table's state (a tied weight, a new Parameter assigned).
    Under DDP the rows would be stepped from this process's gradient alone, never
    averaged: torch marks the module whose forward runs (``_active_ddp_module``, private;
    a torch without it is not checked).
    """
    if update is None or not torch.is_grad_enabled() or not read.requires_grad:
        return  # (a weight that requires no grad gets no step: input gradients, frozen)
    param = update.param
    if param is not None and read is not param and read._base is not param:
        if _index.data_ptr(read) is None:  # a torch.func transform's tensor: its own refusal
            return
        raise RuntimeError(_not_owned_message(layer, update, read))
    ddp = getattr(nn.parallel.DistributedDataParallel, "_active_ddp_module", None)
    if ddp is not None and _ddp_reduces(ddp, param):
        raise NotImplementedError(
            f"{update.name}: its optimiser in the backward (nnsparse.optim."
            f"apply_optimizer_in_backward) runs inside DistributedDataParallel (attached to "
            f"ddp.module, or before wrapping): it would step the weight from this process's "
            f"gradient only, which DDP never all-reduces, and the ranks would drift apart; "
            f"call remove() on the in-backward optimiser and train with materialised "
            f"gradients (torch.optim, nnsparse.optim.LazyAdam or nnsparse.make_optimizer) "
            f"under DDP")


def _ddp_reduces(ddp: Any, param: Optional[Tensor]) -> bool:
    """Whether ``ddp``, the ``DistributedDataParallel`` whose forward is running, averages
    the gradient of ``param``: one of its module's parameters, not one it was told to
    ignore (or one whose all-reduce it delays).  A model outside the wrapped module, run
    inside its forward, is the user's to keep in step, as an ignored parameter is.
    Identity over DDP's private list (a torch without it: assumed averaged), scanned
    only inside a DDP forward, where a layer with an in-backward table is otherwise refused."""
    if param is None:  # (an update pickled before it kept its parameter: assumed averaged)
        return True
    if getattr(param, "_ddp_ignored", False):
        return False
    params = getattr(ddp, "_module_parameters", None)
    if params is None:
        return True
    return any(p is param for p in list(params) + list(getattr(
        ddp, "_delay_all_reduce_params", [])))


def _pruned(layer: nn.Module) -> Optional[str]:
    """The name of the weight ``torch.nn.utils.prune`` prunes on ``layer`` (``weight`` or
    ``weight_t``: it then holds ``<name>_orig * <name>_mask``, recomputed at each forward),
    or ``None``."""
    from torch.nn.utils import prune
    for hook in layer.__dict__.get("_forward_pre_hooks", {}).values():
        # (a PruningContainer, for pruning applied twice, names the tensor too)
        if isinstance(hook, prune.BasePruningMethod) and getattr(
                hook, "_tensor_name", None) in ("weight", "weight_t"):
            return hook._tensor_name
    return None


def _pruned_update_message(name: str, weight: str) -> str:
    return (f"{name}: its {weight} is pruned (torch.nn.utils.prune: the layer reads "
            f"{weight}_orig * {weight}_mask, recomputed at each forward), and the optimiser "
            f"in the backward (nnsparse.optim.apply_optimizer_in_backward) updates the weight "
            f"the layer reads in place, here that temporary: {weight}_orig would never be "
            f"trained. Call remove() on the in-backward optimiser and train with torch.optim "
            f"or nnsparse.optim.LazyAdam (they train {weight}_orig through the mask), or "
            f"prune.remove(layer, {weight!r}) first (docs/ecosystem.md, 'Pruning a "
            f"SparseLinearBatch')")


def _not_owned_message(layer: nn.Module, update: Any, read: Tensor) -> str:
    """Why the weight a training forward reads is not its in-backward table's Parameter."""
    pruned = _pruned(layer)
    if pruned is not None:
        return _pruned_update_message(update.name, pruned)
    weight = "weight_t" if isinstance(getattr(layer, "_parameters", {}).get("weight_t"),
                                      Tensor) or "weight_t" in layer.__dict__ else "weight"
    base = read._base
    if base is not None and tuple(base.shape) not in (tuple(read.shape), tuple(read.shape)[::-1]):
        # a view of another tensor: a slice of a flat vector (torch.func.functional_call)
        return (f"{update.name}: the optimiser in the backward was built on this layer's "
                f"{weight} Parameter and updates it in place, but the training forward reads "
                f"a view of another {type(base).__name__}, of shape {tuple(base.shape)} (a "
                f"slice of one flat parameter vector given to torch.func.functional_call): "
                f"the update would step that tensor with this table's state, not the "
                f"Parameter it was built on; pass the model's own parameters to "
                f"functional_call (or none for this weight), or call remove() on the "
                f"in-backward optimiser and train with torch.optim or "
                f"nnsparse.optim.LazyAdam (the view then gets dense gradients)")
    read = read if base is None else base  # (weight.t(): a view of weight)
    if not isinstance(read, nn.Parameter):
        what = (f"a {type(read).__name__} that is not a Parameter (a tensor given to "
                f"torch.func.functional_call, or assigned)")
        way = ("pass the model's own parameters to functional_call (or none for this "
               "weight), or call remove() on the in-backward optimiser and train with "
               "torch.optim or nnsparse.optim.LazyAdam")
    else:
        owner = _owner_of(read, update)
        what = (f"the weight of {owner}, which its own in-backward table steps too (a tied "
                f"weight: two steps with two states)" if owner is not None else
                "another Parameter, assigned since the optimiser was attached (a tied "
                "weight, load_state_dict(assign=True), or a new Parameter)")
        way = ("train tied weights with torch.optim or nnsparse.optim.LazyAdam (call "
               "remove() on the in-backward optimiser)")
        if owner is None:
            way += (f"; to load values, copy them in with `with torch.no_grad(): "
                    f"layer.{weight}.copy_(w)`, or call remove() and build the optimiser "
                    f"again after assigning")
    return (f"{update.name}: the optimiser in the backward was built on this layer's "
            f"{weight} Parameter and updates it in place, but the training forward reads "
            f"{what}: the update would step that tensor with this table's state, not the "
            f"Parameter it was built on; {way}")


def _owner_of(param: Tensor, update: Any) -> Optional[str]:
    """The name of the live in-backward table, other than ``update``, built on ``param``."""
    for other in _rowopt.alive(_rowopt.LIVE_UPDATES):  # (another thread may add one)
        if other is not update and other.param is param:
            return other.name
    return None


def _refuse_update_on_parts(update: Any) -> None:
    """The compile input path (SparseParts) has no optimiser in the backward."""
    if update is not None:
        raise NotImplementedError(
            f"{update.name}: the optimiser in the backward does not run on the "
            f"torch.compile input path (SparseParts); use torch.optim or "
            f"nnsparse.make_optimizer with a compiled model")


def _check_not_narrower(x: Any, width: int, name: str, what: str) -> None:
    """A torch sparse tensor declares its width: like ``nn.Linear``, a layer's
    input or pattern must have the layer's (a wider one is refused by
    ``as_sparse_batch``; a list of rows may be narrower)."""
    if isinstance(x, Tensor) and x.layout != torch.strided and x.dim() in (1, 2) and (
            x.shape[-1] < width):
        # (a 1-D vector is most often a Lua pair vector given to from_pairs without its size)
        shape = (f"({width},) (a Lua pair vector: nnsparse.from_pairs(pairs, size={width}))"
                 if x.dim() == 1 else f"(rows, {width})")
        raise ValueError(f"{name} has width {x.shape[-1]}, smaller than {what} {width}; "
                         f"give it shape {shape}")


def _check_layer_args(in_features: Any, out_features: Any, bias: Any, sparse_grad: Any,
                      dtype: Any = None, device: Any = None) -> Tuple[int, int]:
    """The constructor arguments the sparse linear layers share: sizes, flags, dtype and
    device (a name torch does not know is a ValueError here, not torch's RuntimeError).

    Returns the sizes as Python ints (numpy ints and 0-d integer tensors pass,
    as in ``nn.Linear``; a bool or a float does not)."""
    sizes = []
    for arg, value in (("in_features", in_features), ("out_features", out_features)):
        value = as_int(value, arg, expected="a non-negative int")
        if value < 0:
            raise ValueError(f"{arg} must be non-negative, got {value}")
        sizes.append(value)
    itemsize = (dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()).itemsize
    if sizes[0] * sizes[1] * itemsize > _INT64_MAX:  # torch: "Storage size ... overflowed"
        raise ValueError(f"in_features * out_features (the weight's elements, {itemsize} bytes "
                         f"each) must take fewer than 2**63 bytes, got {sizes[0]} * {sizes[1]}")
    as_flag(bias, "bias"), as_flag(sparse_grad, "sparse_grad")  # the callers keep bool(...)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype (the parameters learn), "
                        f"got {dtype_got(dtype)}")
    as_device(device, none=True)
    return sizes[0], sizes[1]


def _check_weight_bias(weight: Any, bias: Any) -> None:
    """Check :func:`sparse_linear`'s dense weight ``(out, in)`` and bias ``(out,)``."""
    for arg, t in (("weight", weight), ("bias", bias)):
        if (t is not None or arg == "weight") and (
                not isinstance(t, Tensor) or t.layout != torch.strided):
            raise TypeError(f"{arg} must be a dense tensor, got "
                            f"{t.layout if isinstance(t, Tensor) else type(t).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (out_features, in_features), "
                         f"got {tuple(weight.shape)}")
    if bias is None:
        return
    if tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},) (out_features), "
                         f"got {tuple(bias.shape)}")
    if bias.dtype != weight.dtype:
        raise ValueError(f"bias must have the weight's dtype {weight.dtype}, got {bias.dtype}")
    if bias.device != weight.device:
        raise ValueError(f"bias must be on the weight's device {weight.device}, got {bias.device}")


def _parameter(layer: nn.Module, name: str, what: str) -> Any:
    """``getattr(layer, name)``, or, when ``del layer.<name>`` removed it, an
    ``AttributeError`` that says so and what to assign (torch's "object has no attribute
    'bias'" came from inside the forward).  ``what`` words the parameter's shape."""
    try:
        return getattr(layer, name)  # (a parameter, an attribute or a view such as weight)
    except AttributeError:
        if name in layer._parameters or name in layer.__dict__:
            raise  # raised inside, not a missing attribute
    fix = ("assign layer.bias = None for no bias, or a parameter of shape " + what
           if name == "bias" else f"assign a parameter of shape {what}")
    raise AttributeError(f"{type(layer).__name__}.{name} was deleted (del layer.{name}); "
                         f"{fix}") from None


def _has_bias(layer: nn.Module) -> bool:
    """``layer.bias is not None``, False once deleted (``extra_repr`` must not raise)."""
    return getattr(layer, "bias", None) is not None


def _check_parameters(layer: nn.Module, weight_name: str, weight: Any, expected: Tuple[int, ...],
                      what: str, bias: Any) -> None:
    """A layer's weight and bias are of the shapes it was built with, dense, of one dtype and
    device: a parameter of another shape assigned to the layer (``layer.weight =
    nn.Parameter(w)``) is named here, not found later as a wrong input width or a torch
    broadcast error.  Metadata only (no host synchronisation).

    ``weight_name``, ``expected``, ``what``: the weight's attribute name, its shape and the
    names of its sizes, e.g. ``"weight"``, ``(out, in)``, ``"(out_features, in_features)"``.
    """
    layer_name = type(layer).__name__
    for arg, t in ((weight_name, weight), ("bias", bias)):
        if (t is not None or arg == weight_name) and (
                not isinstance(t, Tensor) or t.layout != torch.strided):
            got = t.layout if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{layer_name}.{arg} must be a dense tensor, got {got}")
    if tuple(weight.shape) != expected:
        raise ValueError(f"{layer_name}.{weight_name} must have shape {what} = {expected}, "
                         f"got {tuple(weight.shape)}; assign a parameter of the layer's shape, "
                         f"or build a layer of the new sizes")
    if bias is None:
        return
    out_features = getattr(layer, "out_features")
    if tuple(bias.shape) != (out_features,):
        raise ValueError(f"{layer_name}.bias must have shape (out_features,) = "
                         f"({out_features},), got {tuple(bias.shape)}")
    if bias.dtype != weight.dtype:
        raise ValueError(f"{layer_name}.{weight_name} and {layer_name}.bias must have one "
                         f"dtype, got {weight.dtype} and {bias.dtype}; convert the layer "
                         f"(layer.to(dtype)) rather than one parameter")
    if bias.device != weight.device:
        raise ValueError(f"{layer_name}.{weight_name} and {layer_name}.bias must be on one "
                         f"device, got {weight.device} and {bias.device}; move the layer "
                         f"(layer.to(device)) rather than one parameter")


class SparseLinearBatch(LuaMembers):
    r"""``nn.Linear`` for mini-batches of sparse vectors.

    Takes a sparse batch ``(rows, in_features)`` in any accepted form and
    returns the dense ``(rows, out_features)`` output of :func:`sparse_linear`,
    with gradients for the weight (touched columns only), the bias and, when
    they require grad, the input's specified values.  Parameter names,
    shapes and initialisation are ``nn.Linear``'s (the same seed gives the
    same weight), so a ``state_dict`` loads into either and both give the
    same output for ``densify(x)``; a dense input runs ``F.linear``.

    The weight's memory is laid out transposed (``weight.t()`` is
    contiguous): the kernels gather whole input columns, which are then
    contiguous rows, and the dense weight gradient is written in that layout,
    so autograd keeps it without a copy.  ``.to()``, ``state_dict`` loading,
    optimisers and ``deepcopy`` keep the layout.

    **Sparse gradients.**  With ``sparse_grad=True`` the weight's gradient
    holds only the columns the batch touched.  torch's sparse COO tensors can
    be sparse only over leading dimensions, so the layer then keeps the
    weight as the parameter ``weight_t`` of shape ``(in_features,
    out_features)`` (``layer.weight`` is its ``(out, in)`` transposed view,
    made anew at each read: write into it in place, ``with torch.no_grad():
    layer.weight.copy_(w)``, since ``layer.weight.data = w`` replaces the
    data of that temporary view and leaves ``weight_t`` as it was; and
    ``state_dict`` still reads and writes ``"weight"`` in ``nn.Linear``'s
    shape); its gradient is a coalesced hybrid COO tensor over the touched
    rows of ``weight_t``, as ``nn.Embedding(sparse=True)`` gives, and the
    bias gets a sparse COO gradient specifying every entry (each row's output
    adds the whole bias; an entry whose gradient sums to 0 is still touched, so
    a lazy optimiser steps it as Adam would).  A dense (strided) input
    specifies every entry, zeros included, so it touches every row of
    ``weight_t`` (none for a batch of no rows), as the sparse batch holding
    every entry explicitly does; inside ``torch.func`` transforms, a backward
    under ``vmap`` (``is_grads_batched=True``), ``torch.compile`` and
    ``torch.jit.trace`` its gradients are ``F.linear``'s dense ones.  On any
    input the call's gradients are dense (``sparse_grad=False``'s values)
    where a sparse one could not reach the tensors that keep it: for a
    parametrized ``weight_t`` (``torch.nn.utils.parametrize``), and for a
    ``weight_t`` or bias read as a view of a tensor that requires grad
    (slices of one flat parameter vector given to
    ``torch.func.functional_call``, ``p.t()``, ``p[i]``: torch's view
    backwards cannot reshape a sparse gradient) or made by an operation other
    than elementwise products and sums (``torch.cat``, a dtype cast, a custom
    ``autograd.Function``).  A leaf keeps its sparse gradient, and so do the
    leaves of a weight made by products and sums (pruning's
    ``weight_t_orig * weight_t_mask``; ``1 - w`` and a division by a number or
    a 0-d tensor too, not by a larger tensor, which torch's sparse division refuses).
    Optimisers that accept them:
    ``torch.optim.SparseAdam``, ``torch.optim.SGD`` (without momentum or
    weight decay), ``torch.optim.Adagrad`` and
    :class:`nnsparse.optim.LazyAdam`; ``Adam``/``AdamW`` need dense gradients.

    **Pruning** (``torch.nn.utils.prune``).  torch's ``l1_unstructured``
    flattens the weight with ``.view(-1)``, which the column-major layout
    refuses (``RuntimeError: view size is not compatible with input tensor's
    size and stride``): pass the scores row-major,
    ``prune.l1_unstructured(layer, "weight", amount=a,
    importance_scores=layer.weight.contiguous())``.  The pruned layer trains
    (pruned entries stay zero); after ``prune.remove`` the weight is stored
    row-major (each forward then copies it) until
    ``layer.load_state_dict(layer.state_dict(), assign=True)`` stores it
    column-major again.  With ``sparse_grad=True`` prune ``"weight_t"``,
    which needs no scores.  Other methods: ``docs/ecosystem.md``.

    Args:
        in_features (int): size of each input row (the catalogue).
        out_features (int): size of each output row.
        bias (bool, keyword-only): learn an additive bias.  Default: ``True``.
            Keyword-only, unlike ``nn.Linear``'s: Lua's third positional
            argument (``ignoreAccGrad``) must not silently become the bias, so
            a third positional argument raises ``TypeError``.
        sparse_grad (bool): sparse gradients, see above; forces the sparse
            kernels.  Default: ``False``.
        mode (str): ``"auto"``, ``"sparse"`` or ``"dense"``, see
            :func:`sparse_linear`.  Default: ``"auto"``.
        device (torch.device, optional), dtype (torch.dtype, optional): of the
            parameters, as ``nn.Linear``'s factory keywords.  Default: torch's.

    Shape:
        - input: ``(rows, in_features)`` sparse (or dense), or ``(in_features,)``.
        - output: ``(rows, out_features)``, dense, or ``(out_features,)``.

    Raises (in ``forward``, besides :func:`sparse_linear`'s):
        TypeError: the weight (``weight_t`` with ``sparse_grad``) or the bias
            was replaced by a non-dense tensor or ``None`` (the weight).
        ValueError: it was replaced by one of another shape than ``(out_features,
            in_features)`` (``weight_t``: ``(in_features, out_features)``) or
            ``(out_features,)``, or the bias differs from the weight in dtype
            or device.

    Raises (in the constructor):
        TypeError: a size that is not an int, a flag that is not a bool, a
            ``dtype`` that is not floating point, a ``device`` that is not one, a
            third positional argument (Lua's ``ignoreAccGrad``), a ``mode`` that
            is not a str.
        ValueError: a negative size, a weight beyond 2**63 bytes, an unknown
            device name, an unknown ``mode``, or ``sparse_grad=True``
            with ``mode="dense"``.

    Example::

        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> layer = nnsparse.SparseLinearBatch(5, 3)
        >>> x = [torch.tensor([[0., 1.], [4., -1.]]), torch.tensor([[2., 3.]])]  # pair form
        >>> y = layer(x)
        >>> torch.allclose(y, torch.nn.functional.linear(nnsparse.densify(x, size=(2, 5)),
        ...                                               layer.weight, layer.bias))
        True
        >>> layer
        SparseLinearBatch(in_features=5, out_features=3, bias=True,
                          sparse_grad=False, mode='auto')
    """

    # Lua members named in the AttributeError; useGradInput was Lua's third argument
    _LUA_MEMBERS = {**WEIGHT_MEMBERS,
                    "useGradInput": "autograd: the input's gradient (Lua's gradInput) is "
                                    "computed when the input's values require grad"}

    def __init__(self, in_features: int, out_features: int, *args: Any, bias: bool = True,
                 sparse_grad: bool = False, mode: str = "auto",
                 device: Optional[Union[torch.device, str, int]] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if args:
            # Lua's SparseLinearBatch(in, out, ignoreAccGrad): a third positional
            # argument would silently become nn.Linear's bias.
            raise TypeError(
                "SparseLinearBatch takes bias, sparse_grad and mode as keywords (bias=...), "
                f"got {len(args)} extra positional argument(s) {args!r}; Lua's third argument "
                "ignoreAccGrad has no equivalent (gradients accumulate as in torch)")
        in_features, out_features = _check_layer_args(in_features, out_features, bias,
                                                      sparse_grad, dtype, device)
        bias, sparse_grad = bool(bias), bool(sparse_grad)  # a numpy bool, checked, as a bool
        mode = as_choice(mode, "mode", _MODES)
        if sparse_grad and mode == "dense":
            raise ValueError("sparse_grad=True needs the sparse kernels, got mode='dense'")
        factory: Dict[str, Any] = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.sparse_grad, self.mode = sparse_grad, mode
        # the optimiser in the backward, set by nnsparse.optim.apply_optimizer_in_backward
        self._row_update: Any = None
        table = torch.empty(in_features, out_features, **factory)
        if sparse_grad:
            self.weight_t = nn.Parameter(table)
            self._register_state_dict_hook(_weight_to_state_dict)  # type: ignore[no-untyped-call]
            self._register_load_state_dict_pre_hook(  # type: ignore[no-untyped-call]
                _weight_from_state_dict)
        else:
            self.weight = nn.Parameter(table.t())
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation, drawn in its order so a seed gives its values."""
        table = self._table()
        weight = torch.empty(self.out_features, self.in_features, dtype=table.dtype,
                             device=table.device)
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        with torch.no_grad():
            table.copy_(weight.t())
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def _table(self) -> Tensor:
        return self.weight_t if self.sparse_grad else self.weight.t()

    def __getattr__(self, name: str) -> Any:
        # With sparse_grad the parameter is weight_t; weight is its view (also of the
        # plain tensor weight_t that torch.nn.utils.prune puts in the parameter's place).
        if name == "weight":
            table = self.__dict__.get("weight_t",
                                      self.__dict__.get("_parameters", {}).get("weight_t"))
            if isinstance(table, Tensor):
                return table.t()
            if _parametrized_table(self):  # weight_t is then a property of the class
                return self.weight_t.t()
        return super().__getattr__(name)  # (a Lua member's name: LuaMembers's error)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "useGradInput":
            # Lua's switch (layer.useGradInput = true): an attribute of that name would
            # silently do nothing, the input's gradient following requires_grad
            raise member_error(self, name, type(self)._LUA_MEMBERS[name])
        # With sparse_grad, weight is a view of the parameter weight_t: torch's own error
        # ("KeyError: attribute 'weight' already exists") named neither, and a plain
        # tensor would have shadowed the view while the layer kept computing with weight_t.
        if name == "weight" and self.__dict__.get("sparse_grad"):
            raise AttributeError(
                f"SparseLinearBatch(sparse_grad=True) keeps its weight as the parameter "
                f"weight_t of shape (in_features, out_features) = ({self.in_features}, "
                f"{self.out_features}); layer.weight is its transposed view and cannot be "
                f"assigned: assign layer.weight_t = nn.Parameter(w.t().contiguous()) or "
                f"load it with layer.load_state_dict({{'weight': w, ...}})")
        super().__setattr__(name, value)

    def _check_parameters(self) -> None:
        # the flags may have been assigned since __init__ checked them
        as_flag(self.sparse_grad, "sparse_grad")  # (a numpy bool passes, used as its truth)
        # (False on a layer built with True is fine: weight_t then gets dense gradients)
        if self.sparse_grad and _parametrized_table(self):
            pass  # weight_t is a property (the parametrization's output): forward checks it
        elif self.sparse_grad and not ("weight_t" in self._parameters
                                       or "weight_t" in self.__dict__):
            raise ValueError(
                "sparse_grad=True needs the layer built with it (it decides the weight "
                "parameter: weight_t, (in_features, out_features)), got a layer built with "
                "sparse_grad=False; build SparseLinearBatch(..., sparse_grad=True) and load "
                "this layer's state_dict into it")
        if self.sparse_grad and self.mode == "dense":
            raise ValueError("sparse_grad=True needs the sparse kernels, got mode='dense'")
        bias = _parameter(self, "bias", "(out_features,)")
        if self.sparse_grad:
            _check_parameters(self, "weight_t", _parameter(self, "weight_t",
                                                           "(in_features, out_features)"),
                              (self.in_features, self.out_features),
                              "(in_features, out_features)", bias)
        else:
            _check_parameters(self, "weight", _parameter(self, "weight",
                                                         "(out_features, in_features)"),
                              (self.out_features, self.in_features),
                              "(out_features, in_features)", bias)

    @compile_boundary
    def forward(self, input: SparseLike) -> Tensor:
        # before the weight is read: a parametrization runs at each read (spectral_norm
        # updates its buffers), and a refused call changes nothing
        _refuse_update_parametrized(self, self._row_update)
        with _weight_read_once(self):
            return self._forward(input)

    def _forward(self, input: SparseLike) -> Tensor:
        self._check_parameters()
        if self._row_update is not None:  # (the table is read only then)
            _refuse_update_misuse(self, self._row_update, self._table())
        # a parametrized weight_t gets dense gradients (torch's parametrizations refuse a
        # sparse one), as a view does (_linear_table: _sparse_grad_reaches)
        sparse_grad = self.sparse_grad and not _parametrized_table(self)
        if isinstance(input, SparseParts):
            # torch.compile's input path (docs/compile_amp.md): plain tensors
            # through the custom operators of nnsparse/_ops.py, no validation.
            _refuse_update_on_parts(self._row_update)
            return linear_parts(input, self._table(), self.bias, self.mode, self.sparse_grad)
        if self.sparse_grad:  # LazyAdam then trusts the sparse gradients these layers make
            _grad_origin.watch(self, "weight_t")
            _grad_origin.watch(self, "bias")
        return _linear_table(input, self._table(), self.bias, self.mode, sparse_grad,
                             self._row_update)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={_has_bias(self)}, sparse_grad={self.sparse_grad}, mode={self.mode!r}")

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

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str,
                              local_metadata: Dict[str, Any], *args: Any) -> None:
        # With assign=True the given tensor becomes the parameter: an (out, in) weight
        # stored row-major (nn.Linear's) is stored column-major, as the layer keeps it
        # (the kernels read weight.t() rows, and the optimiser in the backward updates
        # them in place, which it refuses on a copy).  Before the sparse_grad hook,
        # which super() runs and which renames the weight.
        weight = state_dict.get(prefix + "weight")
        if (local_metadata.get("assign_to_params_buffers") and isinstance(weight, Tensor)
                and weight.dim() == 2 and not weight.t().is_contiguous()):
            state_dict[prefix + "weight"] = weight.t().contiguous().t()
        missing_keys, unexpected_keys, error_msgs = args[1], args[2], args[3]
        errors_before, unexpected_before = len(error_msgs), len(unexpected_keys)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)
        if self.sparse_grad:
            _name_weight(missing_keys, error_msgs, errors_before, prefix, weight,
                         (self.out_features, self.in_features))
            if weight is not None:
                # the state's weight, renamed weight_t by the pre-hook, is unexpected in a
                # layer without that parameter (pruned: weight_t_orig; parametrized): torch
                # listed "weight_t", a key the caller never gave
                unexpected_keys[unexpected_before:] = [
                    prefix + "weight" if k == prefix + "weight_t" else k
                    for k in unexpected_keys[unexpected_before:]]


def _parametrizations(layer: nn.Module) -> Optional[nn.ModuleDict]:
    """``layer``'s ``torch.nn.utils.parametrize`` parametrizations, or ``None``: read from
    ``_modules`` without ``nn.Module.__getattr__`` (nor running any parametrization)."""
    parametrizations: Optional[nn.ModuleDict] = layer.__dict__.get("_modules", {}).get(
        "parametrizations")
    return parametrizations


def _parametrized_table(layer: nn.Module, name: str = "weight_t") -> bool:
    """``name`` holds a parametrization (``torch.nn.utils.parametrize``): it is then
    neither a parameter nor in ``__dict__``, but a property of the parametrized class."""
    parametrizations = _parametrizations(layer)
    return parametrizations is not None and name in parametrizations


def _weight_read_once(layer: nn.Module) -> ContextManager[Any]:
    """The context a forward runs in: for a parametrized layer, ``parametrize.cached()``, so
    that the parametrization runs once per call as under ``nn.Linear`` (the forward reads the
    weight in its checks, its dtype test and the product: three runs of ``spectral_norm``'s
    power iteration otherwise); for any other layer nothing."""
    if parametrize.is_parametrized(layer):
        return parametrize.cached()
    return contextlib.nullcontext()


def _refuse_update_parametrized(layer: nn.Module, update: Any) -> None:
    """``RuntimeError`` for a training call of a layer with the optimiser in the backward
    whose weight was parametrized after the optimiser was attached: the update would
    write the parametrization's output, a temporary, and its originals would never move."""
    if update is not None and torch.is_grad_enabled() and _parametrized_weight(layer):
        raise RuntimeError(_parametrized_update_message(update.name))


def _parametrized_weight(layer: nn.Module) -> bool:
    """Whether the weight (``weight``, or ``weight_t`` of a ``sparse_grad=True``
    ``SparseLinearBatch``) holds a ``torch.nn.utils.parametrize`` parametrization."""
    return _parametrized_table(layer, "weight") or _parametrized_table(layer, "weight_t")


def _parametrized_weight_trains(layer: nn.Module) -> bool:
    """Whether the tensors of a parametrized weight (its originals, the parametrizations'
    own parameters) require grad, read without computing the parametrization: each read
    of the weight runs it (``spectral_norm``'s power iteration updates its buffers)."""
    parametrizations = _parametrizations(layer)
    return parametrizations is not None and any(
        p.requires_grad for name in ("weight", "weight_t") if name in parametrizations
        for p in parametrizations[name].parameters())


def _parametrized_update_message(name: str) -> str:
    return (f"{name}: its weight is parametrized (torch.nn.utils.parametrize: weight_norm, "
            f"spectral_norm, register_parametrization), and the optimiser in the backward "
            f"(nnsparse.optim.apply_optimizer_in_backward) updates the weight the layer reads "
            f"in place, here the parametrization's output, recomputed at each forward: the "
            f"parametrization's original tensors would never be trained. Call remove() on the "
            f"in-backward optimiser and train with torch.optim or nnsparse.optim.LazyAdam, or "
            f"remove the parametrization (parametrize.remove_parametrizations)")


def _weight_to_state_dict(module: nn.Module, state_dict: Dict[str, Any], prefix: str,
                          local_metadata: Dict[str, Any]) -> None:
    """State dicts hold ``weight`` in ``nn.Linear``'s ``(out, in)`` shape."""
    if prefix + "weight_t" not in state_dict:
        # a parametrized weight_t (torch.nn.utils.parametrize) is saved as its
        # parametrization's originals, under their own keys, as torch saves them
        return
    table = state_dict.pop(prefix + "weight_t")
    state_dict[prefix + "weight"] = table.t()


def _weight_from_state_dict(state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    if prefix + "weight" in state_dict:
        weight = state_dict.pop(prefix + "weight")
        # (not a tensor: torch's copy refuses it, named weight by _name_weight)
        state_dict[prefix + "weight_t"] = weight.t() if isinstance(weight, Tensor) else weight


def _name_weight(missing_keys: List[str], error_msgs: List[str], start: int, prefix: str,
                 given: Any, shape: Tuple[int, int]) -> None:
    """torch's report of a ``sparse_grad`` layer's load in a container that does not check
    the whole state first (``nn.Sequential``) named the layer's internal parameter, shape
    ``(in, out)``: ``Missing key(s) in state_dict: "0.weight_t"``, a size mismatch of the
    transposed shapes.  The state's name and shapes instead: ``weight``, ``(out, in)``."""
    internal, key = prefix + "weight_t", prefix + "weight"
    missing_keys[:] = [key if k == internal else k for k in missing_keys]
    for i in range(start, len(error_msgs)):
        if error_msgs[i].startswith(f"size mismatch for {internal}:") and \
                isinstance(given, Tensor):
            error_msgs[i] = (f"size mismatch for {key}: copying a param with shape "
                             f"{given.shape} from checkpoint, the shape in current model is "
                             f"{torch.Size(shape)}.")
        else:
            error_msgs[i] = error_msgs[i].replace(f'"{internal}"', f'"{key}"')
