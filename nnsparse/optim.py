"""Lazy optimisers: a step touches only the parameter entries a batch used.

With sparse gradients (``SparseLinearBatch(sparse_grad=True)`` for an
encoder, ``SparseOutputLinear(sparse_grad=True)`` for a decoder) a batch of
ratings touches a few columns of the encoder's weight and a few rows of the
decoder's; :class:`LazyAdam` updates those entries and their moment estimates
only, so the step costs in proportion to the touched entries, not to the
catalogue.  Dense gradients (a bias, or a layer in dense mode) get the plain
Adam update, so one optimiser serves the whole model.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from torch import Tensor
from torch.optim import Optimizer

__all__ = ["LazyAdam"]

# Touched entries are updated in chunks of about this many elements, so the
# temporaries of a step stay small even when a batch touches most of a large
# matrix (Netflix: 480,189 x 500 decoder rows).
_CHUNK = 1 << 22
# Use torch's fused Adam kernels when available (tests turn this off to check
# the plain path too).
_USE_FUSED = True


class LazyAdam(Optimizer):
    r"""Adam whose step updates only the entries that have a gradient.

    For a dense gradient this is Adam (``torch.optim.Adam`` with the same
    arguments, ``decoupled_weight_decay=True`` being AdamW).  For a sparse COO
    gradient (a hybrid one with one sparse dimension over a weight's rows, as
    ``nn.Embedding`` and :class:`nnsparse.SparseOutputLinear` give, or a
    2-D COO one over single entries or whole columns, as
    ``SparseLinearBatch`` gives) only the specified entries are read and
    written, as ``torch.optim.SparseAdam`` does: their moments decay and are
    updated, the others keep theirs unchanged (not decayed).  The bias
    correction uses the parameter's own step count, and ``eps`` is added
    after the second moment's bias correction, as in Adam (SparseAdam adds it
    before, a difference of order ``eps``).  Duplicate entries of an
    uncoalesced gradient are summed first.

    Weight decay is lazy too: it is applied to the touched entries only, at
    the steps where they are touched (an entry that no batch touches is not
    decayed, one that every batch touches is decayed as by Adam/AdamW).
    With ``decoupled_weight_decay=False`` it is added to the gradient
    (``g + weight_decay * p``, L2 as in Adam); with ``True`` the touched
    entries are shrunk by ``lr * weight_decay`` (AdamW).

    Args:
        params: parameters or parameter groups.
        lr (float): learning rate.  Default: ``1e-3``.
        betas (Tuple[float, float]): decay rates of the first and second
            moments.  Default: ``(0.9, 0.999)``.
        eps (float): added to the denominator.  Default: ``1e-8``.
        weight_decay (float): lazy weight decay, see above.  Default: ``0``.
        decoupled_weight_decay (bool): AdamW-style decay.  Default: ``False``.

    Example::

        >>> emb = torch.nn.Embedding(10, 3, sparse=True)
        >>> opt = nnsparse.optim.LazyAdam(emb.parameters(), lr=0.1, weight_decay=0.01)
        >>> before = emb.weight.detach().clone()
        >>> emb(torch.tensor([1, 4])).sum().backward()
        >>> opt.step()
        >>> (emb.weight.detach() != before).any(1).nonzero().flatten()
        tensor([1, 4])
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr must be non-negative, got {lr}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Perform one optimisation step (see the class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                _update(p, p.grad, state, group)
        return loss


def _update(p: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    """Dispatch on the gradient's layout: all entries, rows, columns or single entries."""
    m, v = state["exp_avg"], state["exp_avg_sq"]
    step = state["step"]
    if grad.layout == torch.strided:
        _adam([p], [grad], [m], [v], step, group)
        return
    if grad.layout != torch.sparse_coo:
        raise NotImplementedError(f"LazyAdam supports strided and sparse COO gradients, "
                                  f"got layout {grad.layout}")
    if grad.sparse_dim() == 2 and p.dim() == 2:
        cols = _whole_columns(grad._indices(), p.shape[0])
        if cols is not None:
            # row-major blocks of whole columns: values form a (rows, len(cols)) block
            values = grad._values().view(p.shape[0], cols.shape[0])
            _columns(p, cols, values, m, v, step, group)
            return
    index, values = _coalesced(grad)
    if values.shape[0] == 0:
        return  # nothing touched: nothing changes (the step count still advances)
    if grad.sparse_dim() == 1:
        width = p[0].numel() if p.dim() > 1 else 1
        _rows(p.view(-1, width), index[0], values.reshape(-1, width),
              m.view(-1, width), v.view(-1, width), step, group)
        return
    if p.dim() != 2 or grad.sparse_dim() != 2:
        raise NotImplementedError(f"LazyAdam supports sparse gradients with one sparse "
                                  f"dimension, or two for a 2-D parameter, got sparse_dim "
                                  f"{grad.sparse_dim()} for a {p.dim()}-D parameter")
    # single entries: rows of width 1 of the flattened parameter
    _rows(p.view(-1, 1), index[0] * p.shape[1] + index[1], values.unsqueeze(1),
          m.view(-1, 1), v.view(-1, 1), step, group)


def _coalesced(grad: Tensor) -> Tuple[Tensor, Tensor]:
    """Indices and values with distinct positions in row-major order.

    Autograd hands over a sparse gradient without its "coalesced" flag even
    when a layer built it coalesced; an O(nnz) check spares the sort then.
    """
    if not grad.is_coalesced():
        index = grad._indices()
        key = index[0]
        for d in range(1, index.shape[0]):
            key = key * grad.shape[d] + index[d]
        if not (key.numel() < 2 or bool((key[1:] > key[:-1]).all())):
            grad = grad.coalesce()
    return grad._indices(), grad._values()


def _whole_columns(index: Tensor, rows: int) -> Optional[Tensor]:
    """The columns, when a 2-D pattern is, in row-major order, every row of some columns.

    That is what a sparse-input layer's weight gradient looks like (the
    columns a batch touched, all output rows).  The check proves the pattern
    coalesced too, at the cost of two comparisons per entry, much cheaper
    than a general coalescing check on tens of millions of entries.
    """
    nnz = index.shape[1]
    if rows == 0 or nnz == 0 or nnz % rows != 0:
        return None
    width = nnz // rows
    cols = index[1, :width]
    if width > 1 and not bool((cols[1:] > cols[:-1]).all()):
        return None
    if not torch.equal(index[1].view(rows, width), cols.expand(rows, width)):
        return None
    row_ids = torch.arange(rows, device=index.device).unsqueeze(1)
    if not bool((index[0].view(rows, width) == row_ids).all()):
        return None
    return cols


def _adam(ps: List[Tensor], gs: List[Tensor], ms: List[Tensor], vs: List[Tensor], step: int,
          group: dict) -> None:
    """Adam/AdamW on contiguous tensors, in place: torch's fused kernel where it has one."""
    beta1, beta2 = group["betas"]
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    decoupled = group["decoupled_weight_decay"]
    if _fused_ok(ps[0]):
        fused = torch._fused_adamw_ if decoupled else torch._fused_adam_
        steps = [torch.tensor(float(step), device=p.device) for p in ps]
        fused(ps, gs, ms, vs, [], steps, lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd,
              eps=eps, amsgrad=False, maximize=False)
        return
    bias1, bias2 = 1 - beta1 ** step, 1 - beta2 ** step
    for p, g, m, v in zip(ps, gs, ms, vs):
        if wd != 0 and not decoupled:
            g = g.add(p, alpha=wd)
        if wd != 0 and decoupled:
            p.mul_(1 - lr * wd)
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = v.sqrt().div_(math.sqrt(bias2)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / bias1)


def _fused_ok(p: Tensor) -> bool:
    # torch's fused Adam kernels (one pass instead of about ten) exist on CPU
    # and CUDA for floating dtypes; they need contiguous tensors, which every
    # call here passes.
    return (_USE_FUSED and hasattr(torch, "_fused_adam_") and p.device.type in ("cpu", "cuda")
            and p.is_floating_point())


def _rows(p: Tensor, rows: Tensor, values: Tensor, m: Tensor, v: Tensor, step: int,
          group: dict) -> None:
    """Update the rows ``rows`` (distinct, increasing) of 2-D ``p``; ``values`` are their gradients.

    The parameter is walked in blocks of about ``_CHUNK`` elements.  In a
    block where at most half the rows are touched, those rows are gathered,
    updated and scattered back; where more are, the whole block is updated
    with a zero gradient on the untouched rows, whose old values (parameter
    and moments) are saved before and restored after: fewer passes over
    memory, the same result.
    """
    n_rows, width = p.shape
    block = max(1, _CHUNK // max(1, width))
    bounds = torch.searchsorted(rows, torch.arange(0, n_rows + block, block, device=rows.device))
    bounds = bounds.tolist()
    for i, start in enumerate(range(0, n_rows, block)):
        lo, hi = bounds[i], bounds[i + 1]
        if hi == lo:
            continue
        stop = min(start + block, n_rows)
        idx, g = rows[lo:hi], values[lo:hi]
        if 2 * (hi - lo) <= stop - start:
            part = [t.index_select(0, idx) for t in (p, m, v)]
            _adam([part[0]], [g], [part[1]], [part[2]], step, group)
            for t, new in zip((p, m, v), part):
                t.index_copy_(0, idx, new)
        else:
            local = idx - start
            dense_g = g.new_zeros(stop - start, width).index_copy_(0, local, g)
            keep = torch.ones(stop - start, dtype=torch.bool, device=idx.device)
            keep[local] = False
            untouched = keep.nonzero().squeeze(1)
            views = [t[start:stop] for t in (p, m, v)]
            saved = [t.index_select(0, untouched) for t in views]
            _adam([views[0]], [dense_g], [views[1]], [views[2]], step, group)
            for t, old in zip(views, saved):
                t.index_copy_(0, untouched, old)


def _columns(p: Tensor, cols: Tensor, values: Tensor, m: Tensor, v: Tensor, step: int,
             group: dict) -> None:
    """Update the columns ``cols`` (distinct) of a 2-D ``p`` from a ``(rows, len(cols))`` block.

    When at most a quarter of the columns are touched they are gathered,
    updated and scattered back, in chunks of columns (a strided gather, slower
    than a row gather: hence a lower threshold than in :func:`_rows`, as
    measured).  When more are, ``p`` is walked in blocks of whole rows
    (contiguous): each block is updated with a zero gradient on the untouched
    columns, whose old values are saved before and restored after.
    """
    n_rows, n_cols = p.shape
    if 4 * cols.shape[0] > n_cols:
        keep = torch.ones(n_cols, dtype=torch.bool, device=cols.device)
        keep[cols] = False
        untouched = keep.nonzero().squeeze(1)
        block = max(1, _CHUNK // max(1, n_cols))
        for start in range(0, n_rows, block):
            stop = min(start + block, n_rows)
            dense_g = values.new_zeros(stop - start, n_cols)
            dense_g.index_copy_(1, cols, values[start:stop])
            views = [t[start:stop] for t in (p, m, v)]
            saved = [t.index_select(1, untouched) for t in views]
            _adam([views[0]], [dense_g], [views[1]], [views[2]], step, group)
            for t, old in zip(views, saved):
                t.index_copy_(1, untouched, old)
        return
    chunk = max(1, _CHUNK // max(1, n_rows))
    for start in range(0, cols.shape[0], chunk):
        idx, g = cols[start:start + chunk], values[:, start:start + chunk].contiguous()
        part = [t.index_select(1, idx) for t in (p, m, v)]
        _adam([part[0]], [g], [part[1]], [part[2]], step, group)
        for t, new in zip((p, m, v), part):
            t.index_copy_(1, idx, new)
