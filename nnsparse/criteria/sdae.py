"""Stacked denoising autoencoder criteria: corrupt the input, weight the loss.

:meth:`prepare_input` corrupts a batch and remembers which entries it
corrupted; the loss weights the wrapped criterion by ``alpha`` on those and by
``beta`` on the others (Vincent et al., 2010; Strub et al., 2016).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .._forms import (SparseBatch, SparseLike, as_sparse_batch, compile_boundary, holds_exactly,
                      is_sparse_form)
from ._elementwise import (ElementwiseLoss, RefuseLuaNames, Setting, bool_arg, checked_loss,
                           conf_settings, elementwise_loss, generator_arg, non_negative_arg,
                           pair_arg, ratio_arg, real_arg, resolve_size_average, weighted_sum)
from ._entries import DECLARED_WIDTH, Estimate, as_estimate, as_target, lookup, unique_entries

__all__ = ["SDAECriterion", "SDAESparseCriterion"]


def _check_generator(generator: Optional[torch.Generator], device: torch.device) -> None:
    if generator is not None and generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device}, the data on {device}; "
                         f"make it with torch.Generator(device='{device.type}')")


def _corrupt_values(values: Tensor, noise_ratio: float, noise_mean: float, noise_std: float,
                    flip_ratio: float, flip_range: Sequence[float], hide_ratio: float,
                    generator: Optional[torch.Generator]) -> Tuple[Tensor, Tensor, Tensor]:
    """Corrupt each entry of ``values`` independently (vectorised).

    One uniform draw per entry picks its fate: noise (``r < noise_ratio``), flip,
    hide, or untouched, in that order, as in Lua nnsparse.  The draws are
    ``rand`` for the fate, then ``randn`` for the noise (only if
    ``noise_ratio > 0``), then ``rand`` for the flip side (only if
    ``flip_ratio > 0``), so a seeded generator reproduces the corruption.

    Returns:
        ``(corrupted values, corrupted mask, hidden mask)``; hidden entries hold 0.
    """
    _check_generator(generator, values.device)
    shape, device = values.shape, values.device
    # float32 draws even for half values (and whatever torch's default dtype: a bfloat16
    # draw fell below 0.1 for 10.2 % of the entries), so ratios stay exact to ~1e-7.
    fate = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    out = values
    if noise_ratio > 0:
        noise = torch.randn(shape, generator=generator, device=device, dtype=values.dtype)
        out = torch.where(fate < noise_ratio, out + noise * noise_std + noise_mean, out)
    if flip_ratio > 0:
        side = torch.rand(shape, generator=generator, device=device, dtype=torch.float32) < 0.5
        flipped = torch.where(side, values.new_tensor(flip_range[0]),
                              values.new_tensor(flip_range[1]))
        out = torch.where((fate >= noise_ratio) & (fate < noise_ratio + flip_ratio), flipped, out)
    corrupted_bound = noise_ratio + flip_ratio + hide_ratio
    hidden = (fate >= noise_ratio + flip_ratio) & (fate < corrupted_bound)
    if hide_ratio > 0:
        out = out.masked_fill(hidden, 0)
    if out is values:
        out = values.clone()
    return out, fate < corrupted_bound, hidden


def _check_noise(mean: float, std: float, dtype: torch.dtype) -> None:
    """The noise's mean and standard deviation must lie within the input's floating dtype:
    beyond it every noised entry became inf (a float16 batch with ``noise_mean=1e5``)."""
    for name, value in (("noise_mean", mean), ("noise_std", std)):
        if not holds_exactly(dtype, value):
            top = torch.finfo(dtype).max
            raise ValueError(f"{name} must be a value the input's dtype {dtype} can hold "
                             f"(in [{-top}, {top}]), got {value}: the noised entries would "
                             f"be inf")


def _check_flip_range(flip_range: Tuple[float, float], dtype: torch.dtype) -> None:
    """The flip values must be stored exactly in the input values' dtype (a float's
    within its range): a cast would change them silently or fail in torch."""
    if all(holds_exactly(dtype, v) for v in flip_range):
        return
    if dtype.is_floating_point:
        top = torch.finfo(dtype).max
        what = f"values in [{-top}, {top}]"
    elif dtype == torch.bool:
        what = "0 or 1"
    else:
        info = torch.iinfo(dtype)
        what = f"integers in [{info.min}, {info.max}]"
    raise ValueError(f"flip_range must hold values the input's dtype {dtype} can hold "
                     f"({what}), got {flip_range}")


# The settings of the SDAE criteria and their defaults, in argument order.
_SDAE_DEFAULTS = dict(alpha=1.0, beta=0.0, noise_ratio=0.0, noise_mean=0.0, noise_std=0.2,
                      flip_ratio=0.0, flip_range=(-1.0, 1.0), hide_ratio=0.0)


class _SDAEBase(RefuseLuaNames, nn.Module):
    """Arguments, validation and weighting shared by both SDAE criteria."""

    # Each setting is checked when assigned (here or later: Lua's SetAlpha is
    # ``crit.alpha = a``); a refused assignment keeps the old value.
    alpha = Setting(non_negative_arg)
    beta = Setting(non_negative_arg)
    noise_ratio = Setting(ratio_arg)
    noise_mean = Setting(real_arg)
    noise_std = Setting(non_negative_arg)
    flip_ratio = Setting(ratio_arg)
    flip_range = Setting(pair_arg)
    hide_ratio = Setting(ratio_arg)
    generator = Setting(generator_arg)
    size_average = Setting(bool_arg)

    def __init__(self, criterion: nn.Module, alpha: Union[float, Mapping[str, Any]] = 1.0,
                 beta: float = 0.0,
                 noise_ratio: float = 0.0, noise_mean: float = 0.0, noise_std: float = 0.2,
                 flip_ratio: float = 0.0, flip_range: Sequence[float] = (-1.0, 1.0),
                 hide_ratio: float = 0.0, generator: Optional[torch.Generator] = None,
                 size_average: Optional[bool] = None) -> None:
        super().__init__()
        if isinstance(alpha, Mapping):  # Lua's SDAECriterion(criterion, SDAEconf)
            given = dict(beta=beta, noise_ratio=noise_ratio, noise_mean=noise_mean,
                         noise_std=noise_std, flip_ratio=flip_ratio, flip_range=flip_range,
                         hide_ratio=hide_ratio)
            conf = conf_settings(alpha, given, _SDAE_DEFAULTS, type(self).__name__)
            alpha, beta, noise_ratio, noise_mean, noise_std, flip_ratio, flip_range, hide_ratio = (
                conf[k] for k in _SDAE_DEFAULTS)
        elementwise_loss(criterion)  # checked now; read again at each call
        self.criterion = criterion
        self.alpha, self.beta = alpha, beta
        self.noise_ratio, self.noise_mean, self.noise_std = noise_ratio, noise_mean, noise_std
        self.flip_ratio, self.flip_range = flip_ratio, flip_range
        self.hide_ratio = hide_ratio
        self.generator = generator
        self.size_average = resolve_size_average(criterion, size_average, type(self).__name__)
        self._mask: Any = None
        self._check_ratios()

    def _check_ratios(self) -> None:
        """What ties the corruption settings together (each is checked when assigned)."""
        total = self.noise_ratio + self.flip_ratio + self.hide_ratio
        if total > 1.0 + 1e-12:
            raise ValueError("noise_ratio + flip_ratio + hide_ratio must be at most 1, got "
                             f"{self.noise_ratio} + {self.flip_ratio} + {self.hide_ratio} = {total}")

    def _elementwise(self) -> ElementwiseLoss:
        return checked_loss(self.criterion, self.size_average, type(self).__name__)

    def _corrupt(self, values: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        self._check_ratios()
        if self.noise_ratio > 0 and not values.is_floating_point():
            raise TypeError(f"input values must be floating point for noise_ratio > 0 "
                            f"(Gaussian noise), got dtype {values.dtype}")
        if self.noise_ratio > 0:
            _check_noise(self.noise_mean, self.noise_std, values.dtype)
        if self.flip_ratio > 0:
            _check_flip_range(self.flip_range, values.dtype)
        return _corrupt_values(values, self.noise_ratio, self.noise_mean, self.noise_std,
                               self.flip_ratio, self.flip_range, self.hide_ratio, self.generator)

    def _weighted(self, losses: Tensor, corrupted: Tensor) -> Tensor:
        """``alpha * sum(losses[corrupted]) + beta * sum(losses[~corrupted])``, sync-free."""
        return weighted_sum(losses, corrupted, self.alpha, self.beta)

    def extra_repr(self) -> str:
        return (f"alpha={self.alpha}, beta={self.beta}, noise_ratio={self.noise_ratio}, "
                f"noise_mean={self.noise_mean}, noise_std={self.noise_std}, "
                f"flip_ratio={self.flip_ratio}, flip_range={self.flip_range}, "
                f"hide_ratio={self.hide_ratio}, size_average={self.size_average}")


_SDAE_ARGS = r"""
    Args:
        criterion (nn.Module): an element-wise loss (``nn.MSELoss``, ``nn.L1Loss``,
            ``nn.BCEWithLogitsLoss``, ...); its ``reduction`` is honoured
            (``'sum'`` means ``size_average=False``; ``'none'`` is refused).
        alpha (float): weight of the corrupted entries. Default: 1.  Lua's
            form is accepted too: a mapping in its place holds the settings
            below (Lua's ``SDAEconf`` table, keys ``hideRatio`` or
            ``hide_ratio``...; ``generator`` and ``size_average`` stay keywords).
        beta (float): weight of the other entries. Default: 0.
        noise_ratio (float): probability that an entry gets Gaussian noise. Default: 0.
        noise_mean (float): mean of the noise. Default: 0.
        noise_std (float): standard deviation of the noise. Default: 0.2.  Both
            within the input's floating dtype (checked by :meth:`prepare_input`).
        flip_ratio (float): probability that an entry is set to ``flip_range[0]``
            or ``flip_range[1]``, each with probability 1/2 (salt and pepper). Default: 0.
        flip_range (pair of float): the two flip values (a tuple, a list or a 1-D
            tensor or array of two), finite (an older Lua test's ``{NaN, NaN}`` is
            refused: NaN entries would make the output and the loss NaN), which the
            input's dtype must hold (integers in its range for integer values;
            checked by :meth:`prepare_input`).  Default: ``(-1, 1)``.
        hide_ratio (float): probability that an entry is set to 0. Default: 0.
        generator (torch.Generator, optional): the random source of
            :meth:`prepare_input`, on the data's device type (a CUDA generator
            for CUDA data); the same seed gives the same corruption.  Default:
            torch's global generator.
        size_average (bool): divide the loss (see above). Default: True
            (False for a ``reduction='sum'`` criterion).  Lua's
            ``sizeAverage`` attribute is refused when assigned.

    The three ratios must sum to at most 1; each entry draws one fate.

    Every setting may be assigned later (``crit.alpha = a``, Lua's
    ``SetAlpha``): it is checked when assigned, as by the constructor, and a
    refused value keeps the old one; the sum of the ratios and ``size_average``
    against the criterion's ``reduction`` are checked at the next call."""


class SDAECriterion(_SDAEBase):
    __doc__ = r"""Denoising-autoencoder loss on dense data.

    :meth:`prepare_input` returns a corrupted copy of a dense input and
    remembers which entries it corrupted; the loss is then

    .. math::
        \ell = \frac{1}{d}\Big(\alpha \sum_{\text{corrupted}} L(\hat{y}, y)
               + \beta \sum_{\text{others}} L(\hat{y}, y)\Big)

    with :math:`d` = ``estimate.numel()`` when ``size_average`` is True, else 1.
    The mask may instead be passed to :meth:`forward` (``mask=``), which
    needs no prior :meth:`prepare_input`.
""" + _SDAE_ARGS + r"""

    Shape:
        - input of :meth:`prepare_input`: dense, any shape (usually ``(rows, n)``).
        - estimate, target: dense, the same shape; mask: bool, that shape too.
        - output: a scalar.

    Raises:
        TypeError: a sparse input or target (use :class:`SDAESparseCriterion`);
            integer input values with ``noise_ratio > 0``.
        ValueError: ratios outside [0, 1] or summing above 1; the criterion's ``reduction``
            ``'none'`` or ``'batchmean'`` (use :class:`SparseCriterion` for ``nn.KLDivLoss``'s),
            or ``'sum'`` beside ``size_average=True``; negative
            ``alpha`` or ``beta``, or (the loss call) one beyond the loss's dtype
            (above 3.4e38 for float32 losses, float16 inputs' too); a noise or
            flip value the input's dtype cannot hold; estimate, target
            or mask of different shapes or devices; :meth:`prepare_input` was
            given a batch of another shape, or never called.

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> crit = SDAECriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
        ...                      generator=g)
        >>> x = torch.rand(4, 8)
        >>> noisy = crit.prepare_input(x)          # a quarter of the entries set to 0
        >>> estimate = torch.rand(4, 8, requires_grad=True)
        >>> loss = crit(estimate, x)               # alpha on hidden, beta on the others
        >>> loss.backward()
    """

    _mask: Optional[Tensor]  # what prepare_input corrupted, None before it runs

    @property
    def mask_alpha(self) -> Optional[Tensor]:
        """Where the last :meth:`prepare_input` corrupted its input (Lua's ``maskAlpha``).

        A bool tensor of that input's shape, True at the corrupted entries (the
        ones weighted by ``alpha``); ``None`` before :meth:`prepare_input`.
        """
        return self._mask

    @property
    def mask_beta(self) -> Optional[Tensor]:
        """The entries the last :meth:`prepare_input` left clean, ``~mask_alpha`` (Lua's ``maskBeta``)."""
        return None if self._mask is None else ~self._mask

    def prepare_input(self, input: Tensor) -> Tensor:
        """A corrupted copy of the dense ``input``; remembers the corrupted entries."""
        if is_sparse_form(input) or not isinstance(input, Tensor):
            raise TypeError(f"SDAECriterion corrupts dense tensors, got "
                            f"{_kind(input)}; use SDAESparseCriterion for sparse data")
        out, corrupted, _ = self._corrupt(input)
        self._mask = corrupted
        return out

    @compile_boundary
    def forward(self, estimate: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        for name, t in (("estimate", estimate), ("target", target)):
            if is_sparse_form(t) or not isinstance(t, Tensor):
                raise TypeError(f"SDAECriterion needs a dense {name}, got {_kind(t)}; "
                                "use SDAESparseCriterion for sparse targets")
        if target.shape != estimate.shape:
            raise ValueError(f"target has shape {tuple(target.shape)}, estimate has "
                             f"{tuple(estimate.shape)}")
        if target.device != estimate.device:
            raise ValueError(f"target is on {target.device}, estimate on {estimate.device}")
        elementwise = self._elementwise()
        mask = self._resolve_mask(estimate, mask)
        loss = self._weighted(elementwise(estimate, target), mask)
        return loss / max(estimate.numel(), 1) if self.size_average else loss

    def _resolve_mask(self, estimate: Tensor, mask: Optional[Tensor]) -> Tensor:
        if mask is None:
            if self._mask is None:
                raise ValueError("no corruption mask: call prepare_input on the batch first, "
                                 "or pass mask=")
            if self._mask.shape != estimate.shape:
                raise ValueError(
                    f"prepare_input was given a batch of shape {tuple(self._mask.shape)}, the "
                    f"estimate has shape {tuple(estimate.shape)}; call prepare_input on this batch")
            if self._mask.device != estimate.device:
                raise ValueError(
                    f"prepare_input was given a batch on {self._mask.device}, the estimate is "
                    f"on {estimate.device}; call prepare_input on this batch, on that device")
            return self._mask
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.layout != torch.strided:
            raise TypeError(f"mask must be a bool tensor of layout torch.strided (dense), "
                            f"got {_kind(mask)}")
        if mask.shape != estimate.shape:
            raise ValueError(f"mask must have the estimate's shape {tuple(estimate.shape)}, "
                             f"got {tuple(mask.shape)}")
        if mask.device != estimate.device:
            raise ValueError(f"mask is on {mask.device}, estimate on {estimate.device}")
        return mask


def _kind(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor with layout {x.layout} and dtype {x.dtype}"
    return type(x).__name__


# Not exported, and not renamed _EntryMask: a criterion saved after prepare_input (and a
# fitted CFN) pickles it by this name, which torch.load of those files looks up.
@dataclass
class EntryMask:
    """A flag per specified entry of a prepared batch, kept with its (row, col).

    Stored by position, not by order, so a target given in another form or
    order (uncoalesced, shuffled within rows) is matched entry by entry.
    """

    row: Tensor
    col: Tensor
    flag: Tensor
    rows: int
    width: int
    declared_width: bool
    vector: bool = False

    @classmethod
    def of(cls, batch: SparseBatch, flag: Tensor) -> "EntryMask":
        return cls(batch.row, batch.col, flag, batch.rows, batch.width,
                   batch.form in DECLARED_WIDTH, batch.is_vector)

    def dense(self, corrupted: bool) -> Tensor:
        """A dense bool of the batch's shape: True at the entries whose flag is ``corrupted``."""
        out = torch.zeros(self.rows, self.width, dtype=torch.bool, device=self.flag.device)
        out[self.row, self.col] = self.flag if corrupted else ~self.flag
        return out[0] if self.vector else out

    def check(self, est: Estimate, owner: str) -> None:
        """Raise ``ValueError`` unless ``est`` has the prepared batch's shape."""
        wrong_width = (self.width != est.width) if self.declared_width else (self.width > est.width)
        if self.rows != est.rows or wrong_width:
            raise ValueError(
                f"{owner}.prepare_input was given a batch of shape ({self.rows}, {self.width}), "
                f"the {est.describe()} does not match; call prepare_input on this batch")
        if self.flag.device != est.device:  # (the lookups would fail inside torch)
            raise ValueError(
                f"{owner}.prepare_input was given a batch on {self.flag.device}, the estimate "
                f"is on {est.device}; call prepare_input on this batch, on that device")

    def keys(self, width: int) -> Tensor:
        return self.row * width + self.col  # sorted: the batch was coalesced

    def at(self, keys: Tensor, width: int) -> Tensor:
        """The flag at each of ``keys`` (False for an entry not in the batch)."""
        pos, found = lookup(self.keys(width), keys)
        return found & self.flag[pos] if self.flag.numel() else found


class SDAESparseCriterion(_SDAEBase):
    __doc__ = r"""Denoising-autoencoder loss on sparse data, over the target's entries only.

    :meth:`prepare_input` corrupts only the specified entries of a sparse batch
    and returns the batch in the form it was given (COO, CSR, a list of
    vectors or of pairs) on the input's own pattern: hidden entries stay
    specified with the value 0 (their contribution to a linear layer is zero,
    as if removed; ``docs/sparse_batch.md`` says why they are not removed).  It remembers, for each
    specified ``(row, col)``, whether it was corrupted.  The loss runs over the
    target's specified entries only:

    .. math::
        \ell = \frac{1}{d}\Big(\alpha \sum_{\text{corrupted}} L(\hat{y}_{rc}, y_{rc})
               + \beta \sum_{\text{others}} L(\hat{y}_{rc}, y_{rc})\Big)

    with :math:`d` the number of specified target entries when ``size_average``
    is True, else 1.  Entries are matched by position, so the target may come
    in any form and order; a target entry absent from the prepared batch
    counts as not corrupted.  An explicit ``mask=`` (bool, the estimate's
    dense shape, True where corrupted) replaces the remembered one.
    An uncoalesced input is coalesced before it is corrupted (a duplicate is a
    part of one value, not a value of its own).

    Lua nnsparse divided the gradient by the estimate's width as well; here the
    gradient is the exact derivative of the loss above.
""" + _SDAE_ARGS + r"""

    Shape:
        - input of :meth:`prepare_input`: any accepted sparse form, a batch or a vector.
        - estimate: dense ``(rows, n)`` or ``(n,)``, or sparse whose pattern
          contains the target's.
        - target: any accepted sparse form of that shape.
        - output: a scalar.

    Gradients reach the estimate only at the target's specified entries.

    Raises:
        TypeError: integer input values with ``noise_ratio > 0``, complex target values.
        ValueError: ratios outside [0, 1] or summing above 1; the criterion's ``reduction``
            ``'none'`` or ``'batchmean'`` (use :class:`SparseCriterion` for ``nn.KLDivLoss``'s),
            or ``'sum'`` beside ``size_average=True``; negative
            ``alpha`` or ``beta``, or (the loss call) one beyond the loss's dtype
            (above 3.4e38 for float32 losses, float16 inputs' too); a noise or
            flip value the input's dtype cannot hold; rows or width of estimate
            and target differ; a target index beyond the estimate; a target on another
            device; a mask of the wrong shape;
            :meth:`prepare_input` was given a batch of another shape, or never called.

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> crit = SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5,
        ...                            hide_ratio=0.5, generator=g)
        >>> x = torch.tensor([[0., 3., 0., 4.], [5., 0., 1., 0.]]).to_sparse()
        >>> noisy = crit.prepare_input(x)      # a COO batch again, hidden entries set to 0
        >>> noisy._nnz() == x._nnz()
        True
        >>> estimate = torch.zeros(2, 4, requires_grad=True)
        >>> loss = crit(estimate, x)           # over x's 4 entries
        >>> loss.backward()
    """

    _mask: Optional[EntryMask]  # what prepare_input corrupted, None before it runs

    @property
    def mask_alpha(self) -> Optional[Tensor]:
        """The specified entries the last :meth:`prepare_input` corrupted.

        A dense bool tensor of the prepared batch's shape ``(rows, n)`` (``(n,)``
        for a vector), True at each corrupted specified entry; ``None`` before
        :meth:`prepare_input`.  Lua kept one mask per row over that row's
        entries (``masks[k].alpha``): ``mask_alpha[k][specified[k]]`` in
        increasing column order.  Built on each read (``rows * n`` booleans).
        """
        return None if self._mask is None else self._mask.dense(corrupted=True)

    @property
    def mask_beta(self) -> Optional[Tensor]:
        """The specified entries the last :meth:`prepare_input` left clean (Lua's ``masks[k].beta``).

        As :attr:`mask_alpha`, True at each specified entry that was not
        corrupted; unspecified entries are False in both.
        """
        return None if self._mask is None else self._mask.dense(corrupted=False)

    @compile_boundary
    def prepare_input(self, input: SparseLike) -> SparseLike:
        """A corrupted copy of the sparse ``input``, in its form; remembers the corrupted entries."""
        batch = unique_entries(as_sparse_batch(input, name="input", pairs=False))
        values, corrupted, hidden = self._corrupt(batch.values)
        self._mask = EntryMask.of(batch, corrupted)
        # Hidden entries keep their position with the value 0: the same
        # products (a zero contributes nothing), the input's checked structure
        # shared, and no data-dependent size (a host sync on CUDA).
        return batch.with_values(values)

    @compile_boundary
    def forward(self, estimate: SparseLike, target: SparseLike,
                mask: Optional[Tensor] = None) -> Tensor:
        elementwise = self._elementwise()
        est = as_estimate(estimate, target)
        batch = as_target(target, est)
        keys = batch.linear_index()
        if mask is not None:
            corrupted = _dense_flag(mask, est, keys)
        elif self._mask is None:
            raise ValueError("no corruption mask: call prepare_input on the batch first, "
                             "or pass mask=")
        else:
            self._mask.check(est, type(self).__name__)
            corrupted = self._mask.at(keys, est.width)
        values = est.at_target(batch)
        losses = elementwise(values, batch.values, est.gather(batch.row, batch.col))
        loss = self._weighted(losses, corrupted)
        return loss / max(batch.nnz, 1) if self.size_average else loss


def _dense_flag(mask: Tensor, est: Estimate, keys: Tensor) -> Tensor:
    """An explicit bool mask of the estimate's dense shape, read at ``keys``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.layout != torch.strided:
        raise TypeError(f"mask must be a dense bool tensor, got {_kind(mask)}")
    if tuple(mask.shape) != est.shape:
        raise ValueError(f"mask must have the estimate's shape {est.shape}, "
                         f"got {tuple(mask.shape)}")
    if mask.device != est.device:
        raise ValueError(f"mask is on {mask.device}, estimate on {est.device}")
    return mask.reshape(-1)[keys]
