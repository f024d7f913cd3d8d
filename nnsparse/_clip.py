"""Gradient clipping for models whose gradients may be sparse.

``torch.nn.utils.clip_grad_norm_`` fails on a sparse COO gradient (torch
2.13: ``aten::linalg_vector_norm`` has no SparseCPU/SparseCUDA kernel), which
``sparse_grad=True`` layers and ``nn.Embedding(sparse=True)`` give, and so does
``clip_grad_value_`` (``aten::clamp_min_``).  These are their drop-ins: dense
gradients take torch's own functions, sparse ones work on their values,
in place, without densifying.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Union, cast

import torch
from torch import Tensor

from . import _grad_origin
from ._forms import as_flag, as_real_float


@torch.no_grad()
def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> Tensor:
    r"""``torch.nn.utils.clip_grad_norm_`` that also takes sparse COO gradients.

    The total norm is that of all gradients together, as if concatenated into
    one vector (torch's: the ``norm_type`` norm of the gradients' norms); when
    it exceeds ``max_norm`` every gradient is multiplied in place by
    ``max_norm / (total_norm + 1e-6)``.  Dense (strided) gradients go through
    torch's own ``get_total_norm`` and ``clip_grads_with_norm_`` (torch >= 2.6;
    with torch 2.5, which lacks them, each gradient's ``vector_norm`` and an
    in-place multiply, the same arithmetic).  The norm of
    a sparse COO gradient (any ``sparse_dim``, hybrid or not) is the norm of
    its dense equivalent: of its coalesced values, duplicate indices summed
    first (an uncoalesced gradient, such as autograd makes by adding two
    sparse gradients, is coalesced for the norm only, in a copy), an implicit
    zero counted where the values leave entries out (it matters for a
    negative ``norm_type``, ``-inf`` included).  It is scaled by multiplying its
    values in place: neither densified nor coalesced, so ``p.grad`` keeps its
    indices.

    Args:
        parameters (Tensor or iterable of Tensors): the parameters whose
            ``.grad`` (strided, or sparse COO) are clipped; those without a
            gradient are skipped.
        max_norm (float): the largest total norm allowed.
        norm_type (float or str): the p of the p-norm; ``inf`` (or ``'inf'``, as
            torch takes it) for the largest absolute entry.  Default: ``2.0``.
        error_if_nonfinite (bool): raise, before scaling anything, when the
            total norm is ``nan`` or infinite.  Default: ``False``.
        foreach (bool, optional): passed to torch's functions for the dense
            gradients.  Default: ``None``.

    Returns:
        Tensor: the total norm before clipping, a 0-d tensor on the first
        gradient's device (``tensor(0.)`` when no parameter has a gradient).

    Raises:
        TypeError: ``max_norm`` or ``norm_type`` not a number,
            ``error_if_nonfinite`` not a bool, ``foreach`` neither a bool nor
            ``None``, or a parameter that is not a tensor.
        ValueError: ``max_norm`` negative or NaN, or ``norm_type`` NaN (torch's
            would reverse the gradients or make them NaN) or a str that is no
            number.
        NotImplementedError: a gradient of another layout than strided or
            sparse COO (nothing is scaled).
        RuntimeError: with ``error_if_nonfinite``, a non-finite total norm
            (torch's message; nothing is scaled).

    Example::

        >>> emb = torch.nn.Embedding(10, 2, sparse=True)
        >>> emb(torch.tensor([1, 1, 4])).sum().backward()  # rows 1, 1 and 4: uncoalesced
        >>> dense = emb.weight.grad.to_dense()
        >>> total = nnsparse.optim.clip_grad_norm_(emb.parameters(), max_norm=1.0)
        >>> total  # of the dense gradient: rows 1 (2, 2) and 4 (1, 1)
        tensor(3.1623)
        >>> torch.allclose(emb.weight.grad.to_dense(), dense / 3.1623, atol=1e-4)
        True
    """
    parameters = _parameter_list(parameters)
    max_norm = as_real_float("max_norm", max_norm)
    if not max_norm >= 0.0:
        # torch scales by max_norm / total: NaN gradients for NaN, reversed ones below 0
        raise ValueError(f"max_norm must be non-negative, got {max_norm}")
    if isinstance(norm_type, str):  # torch documents 'inf' (and float()s any str)
        try:
            norm_type = float(norm_type)
        except ValueError:
            raise ValueError(f"norm_type must be a number or 'inf', got {norm_type!r}") from None
    norm_type = as_real_float("norm_type", norm_type)
    if norm_type != norm_type:  # torch's total norm is then NaN, and so is every gradient
        raise ValueError(f"norm_type must be a number or inf, got {norm_type}")
    error_if_nonfinite = as_flag(error_if_nonfinite, "error_if_nonfinite")  # numpy bools pass
    with_grad = _with_grads(parameters, foreach, "clip_grad_norm_")
    grads: List[Tensor] = [cast(Tensor, p.grad) for p in with_grad]
    if not grads:
        return torch.tensor(0.0)
    dense = [p for p, g in zip(with_grad, grads) if g.layout == torch.strided]
    dense_grads = [g for g in grads if g.layout == torch.strided]
    sparse = [g for g in grads if g.layout == torch.sparse_coo]
    norms = _dense_norms(dense_grads, norm_type, foreach)
    norms += [_sparse_norm(g, norm_type) for g in sparse]
    first = grads[0].device  # torch's: the total on the first gradient's device
    total: Tensor = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type)
    if error_if_nonfinite and bool(total.isnan() | total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the "
            "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    # torch's factor, never above 1 (no host read: a multiply by 1 when under)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in sparse:
        mark = _grad_origin.origin(g)  # a layer's gradient stays known in range
        g._values().mul_(scale.to(g.device))
        _grad_origin.keep_mark(g, mark)
    clip_dense = getattr(torch.nn.utils, "clip_grads_with_norm_", None)  # torch >= 2.6
    if dense and clip_dense is not None:
        clip_dense(dense, max_norm, total, foreach)
    else:
        for g in dense_grads:
            g.mul_(scale.to(g.device))
    return total


def _parameter_list(parameters: Any) -> List[Tensor]:
    """The parameters as torch takes them: one tensor or an iterable (a generator read once)."""
    if isinstance(parameters, Tensor):
        return [parameters]
    if isinstance(parameters, (str, bytes)) or not hasattr(parameters, "__iter__"):
        raise TypeError(f"parameters must be a tensor or an iterable of tensors, got "
                        f"{type(parameters).__name__}")
    found = list(parameters)
    for i, p in enumerate(found):
        if not isinstance(p, Tensor):
            raise TypeError(f"parameters must hold tensors, got {type(p).__name__} at {i}")
    return found


def _with_grads(parameters: List[Tensor], foreach: Any, fn: str) -> List[Tensor]:
    """The parameters holding a gradient, after checking ``foreach`` and that every
    gradient is strided or sparse COO (else ``NotImplementedError`` naming ``fn``; nothing
    is clipped)."""
    if foreach is not None:  # a numpy bool passes, as torch's clip_grad_*_ take it
        foreach = as_flag(foreach, "foreach", "a bool or None")
    with_grad = [p for p in parameters if p.grad is not None]
    for p in with_grad:
        layout = cast(Tensor, p.grad).layout
        if layout not in (torch.strided, torch.sparse_coo):
            raise NotImplementedError(f"{fn} takes strided and sparse COO gradients, got "
                                      f"layout {layout}")
    return with_grad


def _dense_norms(grads: List[Tensor], norm_type: float, foreach: Optional[bool]) -> List[Tensor]:
    """The dense gradients' part of the norms torch combines: their total, by torch's own
    ``get_total_norm``; each one's norm for ``norm_type`` 0, where a norm of norms counts
    tensors, not entries, and the total of a group would be counted once."""
    if not grads:
        return []
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if norm_type == 0 or total_norm is None:
        return [torch.linalg.vector_norm(g, norm_type) for g in grads]
    return [total_norm(grads, norm_type, False, foreach)]


def _sparse_norm(grad: Tensor, norm_type: float) -> Tensor:
    """The ``norm_type`` norm of the dense equivalent of the sparse COO ``grad``."""
    from .optim import _coalesced  # the optimiser's coalescing: a sort only when needed

    _, values = _coalesced(grad)
    values = values.reshape(-1)
    if values.numel() < grad.numel():  # entries left out are zeros of the dense gradient
        values = torch.cat([values, values.new_zeros(1)])
    return cast(Tensor, torch.linalg.vector_norm(values, norm_type))


@torch.no_grad()
def clip_grad_value_(parameters: Union[Tensor, Iterable[Tensor]], clip_value: float,
                     foreach: Optional[bool] = None) -> None:
    r"""``torch.nn.utils.clip_grad_value_`` that also takes sparse COO gradients.

    Every gradient entry is clamped to ``[-clip_value, clip_value]`` in place.
    Dense (strided) gradients go through torch's own function.  A sparse COO
    gradient is clamped as its dense equivalent: its values, duplicate indices
    summed first (an uncoalesced gradient is replaced by its coalesced copy in
    ``p.grad``; a coalesced one, such as the layers' ``sparse_grad=True``
    gradients, is clamped in place), never densified.

    Args:
        parameters (Tensor or iterable of Tensors): the parameters whose
            ``.grad`` (strided, or sparse COO) are clipped; those without a
            gradient are skipped.
        clip_value (float): the largest absolute value allowed.  Beyond a
            gradient's dtype range (``1e5`` for float16) it clips nothing there,
            where torch's function raises.
        foreach (bool, optional): passed to torch's function for the dense
            gradients.  Default: ``None``.

    Raises:
        TypeError: ``clip_value`` not a number, ``foreach`` neither a bool nor
            ``None``, or a parameter that is not a tensor.
        ValueError: ``clip_value`` negative or NaN (torch's would set every
            entry to ``-clip_value``, or NaN).
        NotImplementedError: a gradient of another layout than strided or
            sparse COO (nothing is clipped).

    Example::

        >>> emb = torch.nn.Embedding(10, 2, sparse=True)
        >>> emb(torch.tensor([1, 1, 4])).sum().backward()  # rows 1, 1 and 4: uncoalesced
        >>> nnsparse.optim.clip_grad_value_(emb.parameters(), clip_value=1.5)
        >>> emb.weight.grad.to_dense()[[1, 4]]  # row 1's 2 (two 1s summed) clamped to 1.5
        tensor([[1.5000, 1.5000],
                [1.0000, 1.0000]])
    """
    parameters = _parameter_list(parameters)
    clip_value = as_real_float("clip_value", clip_value)
    if not clip_value >= 0.0:
        raise ValueError(f"clip_value must be non-negative, got {clip_value}")
    with_grad = _with_grads(parameters, foreach, "clip_grad_value_")
    # a clip_value beyond a gradient's floating range (1e5 for float16, 1e39 for float32)
    # clips nothing there, and torch's clamp refuses it ("value cannot be converted to
    # type c10::Half without overflow"): such a gradient is left as it is
    with_grad = [p for p in with_grad if not cast(Tensor, p.grad).is_floating_point()
                 or clip_value <= torch.finfo(cast(Tensor, p.grad).dtype).max]
    dense = [p for p in with_grad if cast(Tensor, p.grad).layout == torch.strided]
    if dense:
        torch.nn.utils.clip_grad_value_(dense, clip_value, foreach=foreach)
    for p in with_grad:
        g = cast(Tensor, p.grad)
        if g.layout != torch.sparse_coo:
            continue
        mark = _grad_origin.origin(g)  # a layer's gradient: in range, coalesced
        if not (g.is_coalesced() or _grad_origin.known_coalesced(g)):
            # clamping each duplicate is not clamping their sum
            g = g.coalesce()
            p.grad = g
            mark = None
        g._values().clamp_(-clip_value, clip_value)
        _grad_origin.keep_mark(g, mark)
