"""SparseCriterion: a PyTorch loss evaluated only where a sparse target is specified."""
from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn

from .._forms import SparseLike, compile_boundary
from .._ops import SparseParts

from ._elementwise import (ElementwiseLoss, RefuseLuaNames, Setting, bool_arg, checked_loss,
                           elementwise_loss, reduction_of, resolve_size_average)
from ._entries import as_estimate, as_target

__all__ = ["SparseCriterion", "prepare_input"]


class SparseCriterion(RefuseLuaNames, nn.Module):
    r"""Evaluate an element-wise loss only at the specified entries of a sparse target.

    The estimate is read at the target's specified entries and nowhere else
    (no dense target of the estimate's size is built); the wrapped loss is
    computed there, entry by entry, and summed:

    .. math::
        \ell = \frac{1}{d} \sum_{(r, c) \in \text{target}} L(\hat{y}_{rc}, y_{rc})

    with :math:`d` the number of specified entries of the target
    (``size_average=True``, the default), the number of entries of the
    estimate, ``rows * n`` (``full_size_average=True``), the estimate's first
    dimension (an :class:`~torch.nn.KLDivLoss` with ``reduction='batchmean'``: torch's
    ``input.size(0)``, the ``rows`` of a batch, whether dense ``(rows, n)``, sparse, Lua
    pair rows or a list of rows, and ``n`` for a vector ``(n,)``, as torch divides a 1-D
    input; pass a ``(1, n)`` batch for one sample's sum), or 1 (all False).
    An uncoalesced target is coalesced first (duplicates mean a sum), so each
    position counts once.  A target with no entry gives a loss of 0.

    Args:
        criterion (nn.Module): an element-wise loss (``nn.MSELoss``, ``nn.L1Loss``,
            ``nn.SmoothL1Loss``, ``nn.HuberLoss``, ``nn.BCELoss``,
            ``nn.BCEWithLogitsLoss``, ...).  Its settings (``beta``, ``delta``,
            ``pos_weight``, ...) are kept; its ``reduction`` is honoured:
            ``'sum'`` means ``size_average=False``, ``'batchmean'`` (``nn.KLDivLoss``'s
            only: torch's other losses refuse it, and so does nnsparse) divides the sum
            by the estimate's first dimension, ``'none'`` is refused.
            ``nn.KLDivLoss(reduction='batchmean')`` on a ``log_softmax`` estimate and a
            click batch is the multinomial log-likelihood of Mult-VAE/Mult-DAE,
            ``-(log_softmax * x).sum(1).mean()``, plus the constant
            ``(x * log x).sum(1).mean()`` (0 for binary clicks), read at the clicks
            only (see the second example).  Weight
            tensors are read at the target's entries as if broadcast to the
            estimate's dense shape (``pos_weight`` of shape ``(n,)`` is per column).
        size_average (bool): divide by the number of specified target entries.
            Default: True (False with a ``reduction='sum'`` criterion or with
            ``full_size_average=True``).  Lua's ``sizeAverage`` attribute is
            refused when assigned (``AttributeError`` naming this one).
        full_size_average (bool): divide by ``estimate``'s number of entries
            instead; needs ``size_average=False``.  Default: False.

    The flags may be assigned later: each must be a bool (checked when
    assigned; a refused value keeps the old one); the two together and
    against the criterion's ``reduction`` are checked at the next call.

    Shape:
        - estimate: dense ``(rows, n)`` or ``(n,)``; or sparse (COO, CSR, a list
          of vectors...) of that shape whose pattern equals or contains the
          target's, e.g. a sparse-output decoder's output.
        - target: any accepted sparse form, ``(rows, n)`` or a vector of width
          ``n`` (a pair tensor's indices must be below ``n``).  A strided
          tensor is dense and refused, except a lone ``(k, 2)`` target of a
          1-D estimate: Lua's one-sample call, taken as its pair vector.
        - output: a scalar, of the estimate's floating dtype (float32 for a
          float16 or bfloat16 estimate: the loss is computed in float32); an
          integer or bool estimate is promoted to the target's floating dtype,
          or to the default dtype for an integer target.

    Gradients reach the estimate only at the target's specified entries (for a
    sparse estimate: its values there), and the target's values.

    Raises:
        TypeError: ``criterion`` has no element-wise form, a flag is not a
            bool, or the target's values are complex.
        ValueError: both averaging modes asked for; the criterion's ``reduction``
            ``'none'``, ``'batchmean'`` on a loss other than ``nn.KLDivLoss``, or
            ``'sum'`` or ``'batchmean'`` beside ``size_average=True`` or
            ``full_size_average=True``; rows or width of estimate and target differ;
            a target index beyond the estimate; the target on another device; a
            sparse estimate missing a target entry.

    Example::

        >>> crit = SparseCriterion(nn.MSELoss())
        >>> estimate = torch.tensor([[1., 2., 3.], [4., 5., 6.]], requires_grad=True)
        >>> target = torch.tensor([[0., 2.5, 0.], [5., 0., 0.]]).to_sparse()
        >>> loss = crit(estimate, target)   # ((2 - 2.5)**2 + (4 - 5)**2) / 2
        >>> loss
        tensor(0.6250, grad_fn=<DivBackward0>)
        >>> loss.backward(); estimate.grad
        tensor([[ 0.0000, -0.5000,  0.0000],
                [-1.0000,  0.0000,  0.0000]])

    The multinomial log-likelihood of Mult-DAE/Mult-VAE (a softmax over every item,
    clicks ``x`` sparse), never densifying ``x``::

        >>> x = torch.tensor([[0., 1., 1.], [1., 0., 0.]]).to_sparse_csr()  # clicks
        >>> log_p = torch.log_softmax(torch.tensor([[0., 1., 2.], [3., 0., 0.]]), dim=1)
        >>> multinomial = SparseCriterion(nn.KLDivLoss(reduction="batchmean"))
        >>> torch.allclose(multinomial(log_p, x), -(log_p * x.to_dense()).sum(1).mean())
        True
    """

    size_average = Setting(bool_arg)
    full_size_average = Setting(bool_arg)

    def __init__(self, criterion: nn.Module, size_average: Optional[bool] = None,
                 full_size_average: bool = False) -> None:
        super().__init__()
        elementwise_loss(criterion)  # checked now; read again at each call
        self.criterion = criterion
        full_size_average = bool_arg(full_size_average, "full_size_average")
        if (full_size_average and size_average is None
                and reduction_of(criterion) == "mean"):
            size_average = False  # full_size_average asks for the other averaging
        self.size_average = resolve_size_average(criterion, size_average, "SparseCriterion",
                                                 batchmean=True)
        self.full_size_average = full_size_average
        self._check_averaging()

    def _check_averaging(self) -> ElementwiseLoss:
        """The wrapped loss, once the settings agree with each other and with it.

        Run at each call: ``size_average``, ``full_size_average`` and
        ``criterion`` may be assigned after the constructor."""
        loss = checked_loss(self.criterion, self.size_average, "SparseCriterion",
                            batchmean=True)
        reduction = reduction_of(self.criterion)
        if self.full_size_average and reduction in ("sum", "batchmean"):
            raise ValueError(f"SparseCriterion: the criterion's reduction={reduction!r} "
                             "contradicts full_size_average=True; keep one of them")
        if self.size_average and self.full_size_average:
            raise ValueError(
                "size_average and full_size_average cannot both be True: divide either by the "
                "number of specified target entries or by the number of estimate entries")
        return loss

    @compile_boundary
    def prepare_input(self, input: SparseLike) -> SparseLike:
        """Return ``input`` unchanged (a plain criterion corrupts nothing).

        Raises:
            TypeError: ``input`` is no batch at all (not a tensor, a
                :class:`~nnsparse.SparseParts` or a list of tensors), as the
                denoising criteria's ``prepare_input`` refuses it.
        """
        if isinstance(input, (Tensor, SparseParts)):
            return input
        if isinstance(input, (list, tuple)):
            for i, row in enumerate(input):
                if not isinstance(row, Tensor):
                    raise TypeError(f"input[{i}] must be a tensor, got {type(row).__name__}")
            return input
        raise TypeError(f"input must be a sparse batch or a dense (rows, n) tensor, got "
                        f"{type(input).__name__}")

    @compile_boundary
    def forward(self, estimate: SparseLike, target: SparseLike) -> Tensor:
        elementwise = self._check_averaging()
        est = as_estimate(estimate, target)
        batch = as_target(target, est)
        values = est.at_target(batch)
        loss = elementwise(values, batch.values, est.gather(batch.row, batch.col)).sum()
        if self.size_average:
            return loss / max(batch.nnz, 1)
        if self.full_size_average:
            return loss / max(est.numel(), 1)  # an empty batch: 0, not 0 / 0
        if reduction_of(self.criterion) == "batchmean":
            # torch's input.size(0): the rows of a batch, n of a vector (n,)
            return loss / max(est.width if est.is_vector else est.rows, 1)
        return loss

    def extra_repr(self) -> str:
        return f"size_average={self.size_average}, full_size_average={self.full_size_average}"


@compile_boundary
def prepare_input(criterion: Any, input: Any) -> Any:
    """Corrupt ``input`` the way ``criterion`` trains on it, or return it unchanged.

    One training loop serves a plain loss and a denoising one: every nnsparse
    criterion has a ``prepare_input`` method (the identity for
    :class:`SparseCriterion`); for any other loss (``nn.MSELoss``, ...) the
    input comes back unchanged.

    Args:
        criterion: an nnsparse criterion, or any loss.
        input: the batch the network is about to read.

    Returns:
        ``criterion.prepare_input(input)`` when the criterion has that method,
        else ``input`` itself.

    Raises:
        TypeError: ``criterion`` is not callable (``None``, a number...): a
            mistaken argument would otherwise pass the input through silently.

    Example::

        >>> x = torch.ones(2, 3)
        >>> prepare_input(nn.MSELoss(), x) is x
        True
    """
    if not callable(criterion):
        raise TypeError(f"criterion must be a loss (a callable such as nn.MSELoss() or an "
                        f"nnsparse criterion), got {type(criterion).__name__}")
    method = getattr(criterion, "prepare_input", None)
    if callable(method):
        return method(input)
    return input
