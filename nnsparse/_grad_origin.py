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
  per parameter of a layer).  The tensor hook sees the incoming gradient and,
  when it is the layer's own tensor (gradients of several uses are summed
  into a new, unmarked tensor), notes its indices' storage.  Hooks registered
  later, or none, may still hand autograd another gradient, so the
  post-accumulate hook marks ``p.grad`` only when its indices are that very
  storage (``p.grad`` was none before: autograd made it from the layer's
  tensor), with its version counter: any in-place change since (which could
  write other indices) voids the mark, and the optimiser checks that gradient
  as any other.  A gradient accumulated into an earlier one is not marked.
  A note the post-accumulate hook does not read (``torch.autograd.grad``,
  ``backward(inputs=...)`` without this parameter: nothing is accumulated) is
  dropped when that backward ends (a callback queued on autograd's engine),
  so that no index storage outlives its backward.

No weak reference to a parameter is kept (``torch.utils.swap_tensors``, which
``Module.to`` uses under ``torch.__future__.set_swap_module_params_on_conversion``,
refuses such a tensor).  Nothing here reads a tensor's values.
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

__all__: List[str] = []

_MADE = "_nnsparse_made"  # on a gradient a layer's backward returned
_ORIGIN = "_nnsparse_origin"  # on p.grad: (its version when marked, known coalesced)
# id(param) -> the storage of the indices of the layer's gradient seen by the tensor hook,
# their offset and count, and whether it is coalesced; read (and dropped) by the
# post-accumulate hook of the same parameter, or at the end of the backward (nothing was
# accumulated).  Holding the storage keeps its address from being reused before the
# comparison.
_SEEN: Dict[int, Tuple[torch.UntypedStorage, int, int, bool]] = {}
# autograd's engine, whose queue_callback runs a function when the current backward ends
_ENGINE = torch.autograd.Variable._execution_engine
# a layer -> {parameter name: id of the parameter given the hooks}: entries die with the layer
_WATCHED: "weakref.WeakKeyDictionary[nn.Module, Dict[str, int]]" = weakref.WeakKeyDictionary()


def mark_made(grad: Tensor) -> Tensor:
    """Mark ``grad``, a coalesced sparse gradient a layer built in range, and return it."""
    setattr(grad, _MADE, True)
    return grad


def watch(layer: nn.Module, name: str) -> None:
    """Put the hooks that carry the mark onto ``layer``'s parameter ``name`` (once).

    Only a leaf ``nn.Parameter`` that requires a gradient, outside a compiled
    region: elsewhere the optimiser simply checks the gradient."""
    param = layer._parameters.get(name)
    if (not isinstance(param, nn.Parameter) or not param.requires_grad or not param.is_leaf
            or torch.compiler.is_compiling()):
        return
    watched = _WATCHED.setdefault(layer, {})
    # the layer holds param, so an equal id is param's (or, for a parameter replaced since,
    # the dead one's id reused: then no marks, only the optimiser's check)
    if watched.get(name) == id(param):
        return
    param.register_hook(_before_accumulation(id(param)))  # type: ignore[no-untyped-call]
    param.register_post_accumulate_grad_hook(_after_accumulation)  # type: ignore[no-untyped-call]
    watched[name] = id(param)


def origin(grad: Optional[Tensor]) -> Optional[Tuple[int, bool]]:
    """``(version, coalesced)`` when ``grad`` is a marked ``p.grad`` unchanged since, else None."""
    mark: Optional[Tuple[int, bool]] = getattr(grad, _ORIGIN, None)
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


def _before_accumulation(key: int) -> Callable[[Tensor], None]:
    # key: id(param), alive while this hook (which it owns) runs
    def hook(grad: Tensor) -> None:
        _SEEN.pop(key, None)
        if getattr(grad, _MADE, False) is not True or grad.layout != torch.sparse_coo:
            return
        index = grad._indices()
        seen = (index.untyped_storage(), int(index.storage_offset()), grad._nnz(),
                grad.is_coalesced())
        try:  # runs after every node of this backward, the post-accumulate hooks too
            _ENGINE.queue_callback(functools.partial(_forget, key, seen))
        except RuntimeError:  # not in a backward autograd's engine runs: no note, no mark
            return
        _SEEN[key] = seen
    return hook


def _forget(key: int, seen: Tuple[torch.UntypedStorage, int, int, bool]) -> None:
    """End of a backward: drop the note of ``key`` unless it was read (``torch.autograd.grad``
    accumulates nothing) or is a later backward's."""
    if _SEEN.get(key) is seen:
        del _SEEN[key]


def _after_accumulation(param: Tensor) -> None:
    seen = _SEEN.pop(id(param), None)
    grad = param.grad
    if seen is None or grad is None or grad.layout != torch.sparse_coo:
        return
    storage, offset, nnz, coalesced = seen
    index = grad._indices()
    # the very indices the layer made: not another hook's gradient, nor a sum with an
    # earlier p.grad (written to new indices)
    if (index.untyped_storage().data_ptr() == storage.data_ptr()
            and index.storage_offset() == offset and grad._nnz() == nnz):
        setattr(grad, _ORIGIN, (grad._version, coalesced))
