"""Sparse gradients made by nnsparse's layers: known in range without a look.

:class:`nnsparse.optim.LazyAdam` checks a sparse gradient's indices against
its parameter's shape, because a hand-set ``p.grad`` may hold any index
(``torch.sparse_coo_tensor`` checks none by default).  The check reads the
bounds back to the host: one synchronisation per step on a GPU.  A gradient
that a layer's backward made from a batch checked where it entered (or
trusted by the caller, :func:`nnsparse.trust`) is in range, and coalesced, by
construction, so it needs no check.  Autograd hands ``p.grad`` over as a new
tensor, though, so the layer's word is carried over by hooks:

* the layer's backward marks each sparse gradient it returns
  (:func:`mark_made`: an attribute on the tensor, metadata only);
* the layer's forward puts two hooks on its parameters (:func:`watch`, once
  per parameter).  The tensor hook sees the incoming gradient before autograd
  accumulates it: it is the layer's own tensor (gradients of several uses are
  summed into a new, unmarked tensor) and ``p.grad`` before was none, empty or
  itself marked.  The post-accumulate hook then marks ``p.grad``, with its
  version counter: any in-place change since (which could write other indices)
  voids the mark, and the optimiser checks that gradient as any other.

Nothing here reads a tensor's values.
"""
from __future__ import annotations

import weakref
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

__all__: list = []

_MADE = "_nnsparse_made"  # on a gradient a layer's backward returned
_ORIGIN = "_nnsparse_origin"  # on p.grad: (its version when marked, known coalesced)
# id(param) -> a weak reference to it, for the parameters that have the hooks
_WATCHED: Dict[int, "weakref.ReferenceType[Tensor]"] = {}
# id(param) -> whether the gradient being accumulated is known coalesced: set by
# the tensor hook, read by the post-accumulate hook of the same parameter
_EXPECTED: Dict[int, bool] = {}


def mark_made(grad: Tensor) -> Tensor:
    """Mark ``grad``, a coalesced sparse gradient a layer built in range, and return it."""
    setattr(grad, _MADE, True)
    return grad


def watch(param: Optional[Tensor]) -> None:
    """Put the hooks that carry the mark onto ``param.grad`` (once per parameter).

    Only a leaf ``nn.Parameter`` that requires a gradient, outside a compiled
    region: elsewhere the optimiser simply checks the gradient."""
    if (not isinstance(param, nn.Parameter) or not param.requires_grad or not param.is_leaf
            or torch.compiler.is_compiling()):
        return
    key = id(param)
    ref = _WATCHED.get(key)
    if ref is not None and ref() is param:
        return
    ref = weakref.ref(param, lambda _: _WATCHED.pop(key, None))
    param.register_hook(_before_accumulation(ref))
    param.register_post_accumulate_grad_hook(_after_accumulation)
    _WATCHED[key] = ref


def origin(grad: Optional[Tensor]) -> Optional[Tuple[int, bool]]:
    """``(version, coalesced)`` when ``grad`` is a marked ``p.grad`` unchanged since, else None."""
    mark = getattr(grad, _ORIGIN, None)
    if mark is None or grad is None or mark[0] != grad._version:
        return None
    return mark


def known_in_range(grad: Tensor) -> bool:
    """Whether ``grad`` holds only gradients nnsparse's layers made (indices in range)."""
    return origin(grad) is not None


def known_coalesced(grad: Tensor) -> bool:
    """Whether ``grad`` is one layer's gradient as it made it: coalesced."""
    mark = origin(grad)
    return mark is not None and mark[1]


def keep_mark(grad: Tensor, mark: Optional[Tuple[int, bool]]) -> None:
    """After nnsparse changed a marked ``grad``'s values in place (clipping), mark it again:
    the indices did not change.  ``mark``: :func:`origin` before the change."""
    if mark is not None:
        setattr(grad, _ORIGIN, (grad._version, mark[1]))


def _before_accumulation(ref: "weakref.ReferenceType[Tensor]"):
    def hook(grad: Tensor) -> None:
        param = ref()
        if param is None:
            return
        prior = param.grad
        ours = getattr(grad, _MADE, False) is True and grad.layout == torch.sparse_coo
        empty = prior is not None and prior.layout == torch.sparse_coo and prior._nnz() == 0
        if ours and (prior is None or empty or origin(prior) is not None):
            # a sum with an earlier gradient is not known coalesced
            _EXPECTED[id(param)] = prior is None and grad.is_coalesced()
        else:
            _EXPECTED.pop(id(param), None)
    return hook


def _after_accumulation(param: Tensor) -> None:
    coalesced = _EXPECTED.pop(id(param), None)
    grad = param.grad
    if coalesced is not None and grad is not None and grad.layout == torch.sparse_coo:
        setattr(grad, _ORIGIN, (grad._version, coalesced))
