"""MaskCriterion: hide observed entries of each row and weight a loss by a mask."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .._forms import SparseLike, as_sparse_batch, compile_boundary, is_int, is_sparse_form
from ._elementwise import (ElementwiseLoss, RefuseLuaNames, Setting, bool_arg, checked_loss,
                           conf_settings, elementwise_loss, generator_arg, non_negative_arg,
                           ratio_arg, resolve_size_average, weighted_sum)
from ._entries import as_estimate, as_target, check_device, lookup, unique_entries
from .sdae import EntryMask, _check_generator, _kind

__all__ = ["MaskCriterion"]


_MASK_DEFAULTS = dict(alpha=1.0, beta=0.0, hide_ratio=0.0)
# The SDAE settings a shared SDAEconf may hold: skipped when they change nothing.
_SDAE_ONLY = dict(noise_ratio=0.0, flip_ratio=0.0, noise_mean=None, noise_std=None,
                  flip_range=None)


def _lua_pairs(x: Any, vector: bool) -> bool:
    """A lone strided ``(k, 2)`` tensor beside a 1-D estimate: Lua's one-sample pair
    vector (a dense target of such an estimate would be 1-D), as ``as_target`` reads it."""
    return (vector and isinstance(x, Tensor) and x.layout == torch.strided and x.dim() == 2
            and x.shape[1] == 2)


class MaskCriterion(RefuseLuaNames, nn.Module):
    r"""Hide a ratio of each row's observed entries and weight the loss by a mask.

    The masked criterion of Lua nnsparse.  :meth:`prepare_input` hides entries
    of the input and remembers them; the loss weights the wrapped criterion by
    ``alpha`` on the hidden entries, ``beta`` on the other observed entries
    and 0 elsewhere:

    .. math::
        \ell = \frac{1}{d} \sum_{r, c} m_{rc} \, L(\hat{y}_{rc}, y_{rc}),
        \qquad m_{rc} = \begin{cases} \alpha & \text{hidden} \\
        \beta & \text{observed, not hidden} \\ 0 & \text{otherwise}\end{cases}

    with :math:`d` = ``estimate.numel()`` (the number of entries of the dense
    estimate, as in Lua) when ``size_average`` is True, else 1.  Where the
    target is sparse, :math:`y` is its dense equivalent (0 where unspecified),
    but only the observed entries are read: no dense target is built.

    * A **sparse input** (any accepted form): each specified entry is hidden
      independently with probability ``hide_ratio``; a row that would lose all
      its entries keeps them all (Lua swaps the masks then).  Hidden entries
      are removed from the returned input, which keeps the input's form.
      "Observed" means specified in that input.
    * A **dense input** ``(rows, n)`` (a lone ``(k, 2)`` pair tensor counts as
      dense: wrap it in a list): every entry is observed;
      ``floor(n * hide_ratio)`` distinct entries of each row are chosen
      uniformly and set to 0.

    Lua's ``updateOutput`` returned 0; here the loss is the one whose gradient
    Lua's ``updateGradInput`` computed.

    Args:
        criterion (nn.Module): an element-wise loss (``nn.MSELoss``, ...); its
            ``reduction`` is honoured (``'sum'`` means ``size_average=False``;
            ``'none'`` is refused).
        alpha (float): weight of the hidden entries. Default: 1.  A mapping
            in its place holds the settings (Lua's ``SDAEconf``: ``alpha``,
            ``beta``, ``hideRatio`` or ``hide_ratio``); an SDAEconf shared
            with an SDAE criterion may hold its noise and flip settings too,
            skipped while ``noiseRatio`` and ``flipRatio`` are 0.
        beta (float): weight of the other observed entries. Default: 0.
        hide_ratio (float): the ratio of entries to hide, in [0, 1]. Default: 0.
        generator (torch.Generator, optional): the random source of
            :meth:`prepare_input`, on the data's device type. Default: torch's
            global generator.
        size_average (bool): divide by the estimate's number of entries. Default: True.

    Every setting may be assigned later (``crit.alpha = a``, Lua's
    ``SetAlpha``): it is checked when assigned, as by the constructor, and a
    refused value keeps the old one.

    Shape:
        - input of :meth:`prepare_input`: a sparse batch or vector, or dense ``(rows, n)``.
        - estimate: dense of the input's (dense) shape, or sparse whose pattern
          contains the input's.
        - target: sparse in any accepted form, or dense, of that shape.
        - output: a scalar.

    Raises:
        ValueError: ``hide_ratio`` outside [0, 1]; the criterion's ``reduction``
            ``'none'`` or ``'batchmean'`` (use :class:`SparseCriterion` for ``nn.KLDivLoss``'s),
            or ``'sum'`` beside ``size_average=True``; a mapping with a non-zero
            ``noiseRatio`` or ``flipRatio``; negative ``alpha`` or
            ``beta``, or (the loss call) one beyond the loss's dtype (above 3.4e38
            for float32 losses, float16 inputs' too); no :meth:`prepare_input`
            before the loss, or an estimate whose shape differs from the prepared
            input's; a target whose rows, width or device differ.

    Example::

        >>> crit = MaskCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
        ...                      generator=torch.Generator().manual_seed(0))
        >>> x = torch.tensor([[1., 0., 2., 3.], [0., 4., 5., 0.]]).to_sparse()
        >>> noisy = crit.prepare_input(x)       # some entries of each row removed
        >>> estimate = torch.zeros(2, 4, requires_grad=True)
        >>> loss = crit(estimate, x)
        >>> loss.backward()
    """

    # Each setting is checked when assigned (``crit.alpha = a`` is Lua's SetAlpha);
    # a refused assignment keeps the old value.
    alpha = Setting(non_negative_arg)
    beta = Setting(non_negative_arg)
    hide_ratio = Setting(ratio_arg)
    generator = Setting(generator_arg)
    size_average = Setting(bool_arg)

    def __init__(self, criterion: nn.Module, alpha: Union[float, Mapping[str, Any]] = 1.0,
                 beta: float = 0.0, hide_ratio: float = 0.0,
                 generator: Optional[torch.Generator] = None,
                 size_average: Optional[bool] = None) -> None:
        super().__init__()
        if isinstance(alpha, Mapping):  # Lua's MaskCriterion(criterion, SDAEconf)
            if is_int(beta) and beta != 0:  # (not a bool, nor a numpy timedelta64)
                # Lua's MaskCriterion(criterion, SDAEconf, inputSize): the third argument
                # lands on beta here, where the generic clash message would puzzle
                raise TypeError(
                    f"MaskCriterion(criterion, SDAEconf) takes no input size (Lua's third "
                    f"argument, inputSize): got a mapping and beta={beta!r}; drop the third "
                    f"argument, or put beta in the mapping")
            conf = conf_settings(alpha, dict(beta=beta, hide_ratio=hide_ratio),
                                 _MASK_DEFAULTS, "MaskCriterion", _SDAE_ONLY)
            alpha, beta, hide_ratio = (conf[k] for k in _MASK_DEFAULTS)
        elementwise_loss(criterion)  # checked now; read again at each call
        self.criterion = criterion
        self.alpha, self.beta = alpha, beta
        self.hide_ratio = hide_ratio
        self.generator = generator
        self.size_average = resolve_size_average(criterion, size_average, "MaskCriterion")
        self._sparse_mask: Optional[EntryMask] = None
        self._dense_mask: Optional[Tensor] = None

    @compile_boundary
    def prepare_input(self, input: SparseLike) -> SparseLike:
        """Hide entries of ``input`` (in its form); remember which ones."""
        if is_sparse_form(input):
            return self._prepare_sparse(input)
        if not isinstance(input, Tensor):
            raise TypeError(f"input must be a sparse batch or a dense (rows, n) tensor, "
                            f"got {_kind(input)}")
        if input.dim() not in (1, 2):
            raise ValueError(f"input must be a sparse batch or a dense (rows, n) tensor, "
                             f"got {_kind(input)} of shape {tuple(getattr(input, 'shape', ()))}")
        _check_generator(self.generator, input.device)
        width = input.shape[-1]
        hide = torch.zeros(input.shape, dtype=torch.bool, device=input.device)
        count = int(width * self.hide_ratio)
        if count > 0:
            # The first `count` columns of a random permutation of each row.
            # (float32 whatever torch's default dtype: the same draw under any default)
            scores = torch.rand(input.shape, generator=self.generator, device=input.device,
                                dtype=torch.float32)
            chosen = scores.argsort(dim=-1)[..., :count]
            hide.scatter_(-1, chosen, True)
        self._dense_mask, self._sparse_mask = hide, None
        return input.masked_fill(hide, 0)

    def _prepare_sparse(self, input: Any) -> SparseLike:
        batch = unique_entries(as_sparse_batch(input, name="input"))
        _check_generator(self.generator, batch.device)
        hide = torch.rand(batch.nnz, generator=self.generator, device=batch.device,
                          dtype=torch.float32) < self.hide_ratio  # (not the default dtype)
        # a row keeps one entry at least; counted per run of equal rows of the row-sorted
        # entries: O(nnz) whatever the row count, no host sync
        row = batch.row
        starts = torch.ones_like(row, dtype=torch.bool)
        starts[1:] = row[1:] != row[:-1]
        run = starts.cumsum(0) - 1
        hidden = torch.zeros_like(row).index_add_(0, run, hide.long())
        entries = torch.zeros_like(row).index_add_(0, run, torch.ones_like(row))
        hide &= ~(hidden == entries)[run]
        self._sparse_mask, self._dense_mask = EntryMask.of(batch, hide), None
        return batch.with_values(batch.values, keep=~hide)

    @compile_boundary
    def forward(self, estimate: SparseLike, target: SparseLike) -> Tensor:
        elementwise = checked_loss(self.criterion, self.size_average, "MaskCriterion")
        if self._sparse_mask is not None:
            loss, numel = self._sparse_loss(elementwise, estimate, target)
        elif self._dense_mask is not None:
            loss, numel = self._dense_loss(elementwise, estimate, target)
        else:
            raise ValueError("no mask: call prepare_input on the batch first")
        return loss / max(numel, 1) if self.size_average else loss

    def _weighted(self, losses: Tensor, hide: Tensor) -> Tensor:
        return weighted_sum(losses, hide, self.alpha, self.beta)

    def _sparse_loss(self, elementwise: ElementwiseLoss, estimate: Any,
                     target: Any) -> Tuple[Tensor, int]:
        mask = self._sparse_mask
        assert mask is not None  # forward calls this with a sparse mask only
        est = as_estimate(estimate)
        if isinstance(target, Tensor):  # the target's device named first, as as_target does
            check_device(target.device, est, "target")
        mask.check(est, type(self).__name__)
        keys = mask.keys(est.width)
        values = est.at(mask.row, mask.col)
        if (isinstance(target, Tensor) and target.layout == torch.strided
                and not _lua_pairs(target, est.is_vector)):  # (as_target reads those)
            if tuple(target.shape) != est.shape:
                raise ValueError(f"target has shape {tuple(target.shape)}, "
                                 f"{est.describe()}")
            check_device(target.device, est, "target")
            wanted = target.reshape(-1).index_select(0, keys)
        else:
            batch = as_target(target, est)
            pos, found = lookup(batch.linear_index(), keys)
            # y is 0 where the target does not specify an observed entry (Lua densified it).
            wanted = (torch.where(found, batch.values[pos], 0) if batch.nnz
                      else values.new_zeros(values.shape))
        losses = elementwise(values, wanted, est.gather(mask.row, mask.col))
        return self._weighted(losses, mask.flag), est.numel()

    def _dense_loss(self, elementwise: ElementwiseLoss, estimate: Any,
                    target: Any) -> Tuple[Tensor, int]:
        hide = self._dense_mask
        assert hide is not None  # forward calls this with a dense mask only
        if not isinstance(estimate, Tensor) or estimate.layout != torch.strided:
            raise TypeError(f"a dense input needs a dense estimate, got {_kind(estimate)}")
        if estimate.shape != hide.shape:
            lua = (" (a lone (k, 2) tensor given to prepare_input is a dense batch; a Lua pair "
                   "vector goes through nnsparse.from_pairs(x, size=n) first)"
                   if _lua_pairs(hide, estimate.dim() == 1) else "")
            raise ValueError(f"MaskCriterion.prepare_input was given a batch of shape "
                             f"{tuple(hide.shape)}, the estimate has shape "
                             f"{tuple(estimate.shape)}; call prepare_input on this batch{lua}")
        if estimate.device != hide.device:
            raise ValueError(f"MaskCriterion.prepare_input was given a batch on {hide.device}, "
                             f"the estimate is on {estimate.device}; call prepare_input on this "
                             f"batch, on that device")
        if is_sparse_form(target) or _lua_pairs(target, estimate.dim() == 1):
            # read against the estimate as the other criteria read a target (rows, width,
            # a one-row batch or a Lua pair vector beside a 1-D estimate), then densified
            batch = as_target(target, as_estimate(estimate))
            target = batch.to_coo().to_dense().reshape(estimate.shape)
        if target.shape != estimate.shape:
            raise ValueError(f"target has shape {tuple(target.shape)}, estimate has "
                             f"{tuple(estimate.shape)}")
        if target.device != estimate.device:
            raise ValueError(f"target is on {target.device}, estimate on {estimate.device}")
        return self._weighted(elementwise(estimate, target), hide), estimate.numel()

    def extra_repr(self) -> str:
        return (f"alpha={self.alpha}, beta={self.beta}, hide_ratio={self.hide_ratio}, "
                f"size_average={self.size_average}")
