"""The per-entry form of an ordinary PyTorch loss module.

nnsparse criteria evaluate a wrapped loss on gathered 1-D values (one per
specified entry of the target) and do their own averaging, as Lua nnsparse set
``sizeAverage = false`` on the criterion it wrapped.  This module turns a loss
module into a function ``(input, target, gather) -> per-entry losses`` that
keeps the module's own settings (``beta``, ``delta``, ``log_target``, ...).
The module's ``reduction`` is read by :func:`resolve_size_average`:
``'sum'`` turns the nnsparse criterion's averaging off, ``'none'`` is refused.
An integer or bool estimate is promoted to the target's floating dtype, or to
the default dtype when the target is not floating; a target of another dtype
is then cast to the estimate's.

Weight tensors (``BCELoss.weight``, ``BCEWithLogitsLoss.weight`` and
``pos_weight``) are read at the target's entries as if broadcast to the dense
shape of the estimate, which is what the dense loss would do with them.
"""
from __future__ import annotations

import copy
import inspect
import math
import numbers
from typing import (Any, Callable, Dict, Generic, Mapping, Optional, Sequence, Tuple, TypeVar,
                    cast, overload)

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._forms import as_flag, holds_exactly, is_real, real_float
from .._lua import CRITERION_MEMBERS, member_error, setting_error

__all__ = ["elementwise_loss", "ElementwiseLoss", "Setting"]

# ``gather(w)`` reads a tensor broadcastable to the estimate's dense shape at
# the entries being evaluated; None means the values are dense already.
Gather = Optional[Callable[[Tensor, str], Tensor]]

_NO_ELEMENTWISE_FORM = (
    nn.CrossEntropyLoss, nn.NLLLoss, nn.MultiLabelMarginLoss, nn.MultiLabelSoftMarginLoss,
    nn.MultiMarginLoss, nn.CosineEmbeddingLoss, nn.MarginRankingLoss, nn.TripletMarginLoss,
    nn.TripletMarginWithDistanceLoss, nn.CTCLoss, nn.GaussianNLLLoss,
)


def _weight(module: nn.Module, attr: str, gather: Gather) -> Optional[Tensor]:
    w = getattr(module, attr, None)
    if w is None or gather is None:
        return w
    return gather(w, f"{type(module).__name__}.{attr}")


def _mse(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.mse_loss(x, y, reduction="none")


def _l1(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.l1_loss(x, y, reduction="none")


def _smooth_l1(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.smooth_l1_loss(x, y, reduction="none", beta=m.beta)


def _huber(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.huber_loss(x, y, reduction="none", delta=m.delta)


def _bce(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.binary_cross_entropy(x, y, weight=_weight(m, "weight", g), reduction="none")


def _bce_logits(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.binary_cross_entropy_with_logits(
        x, y, weight=_weight(m, "weight", g), pos_weight=_weight(m, "pos_weight", g),
        reduction="none")


def _soft_margin(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.soft_margin_loss(x, y, reduction="none")


def _poisson_nll(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.poisson_nll_loss(x, y, log_input=m.log_input, full=m.full, eps=m.eps,
                              reduction="none")


def _kl_div(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.kl_div(x, y, reduction="none", log_target=m.log_target)


def _hinge_embedding(m: Any, x: Tensor, y: Tensor, g: Gather) -> Tensor:
    return F.hinge_embedding_loss(x, y, margin=m.margin, reduction="none")


# Exact types only: a subclass may override forward, and then it goes the
# generic way (its own forward with reduction='none').
_KNOWN = {
    nn.MSELoss: _mse, nn.L1Loss: _l1, nn.SmoothL1Loss: _smooth_l1, nn.HuberLoss: _huber,
    nn.BCELoss: _bce, nn.BCEWithLogitsLoss: _bce_logits, nn.SoftMarginLoss: _soft_margin,
    nn.PoissonNLLLoss: _poisson_nll, nn.KLDivLoss: _kl_div,
    nn.HingeEmbeddingLoss: _hinge_embedding,
}


class ElementwiseLoss:
    """A loss module evaluated entry by entry, with no reduction."""

    def __init__(self, module: nn.Module):
        self.module = module
        self._fn = _KNOWN.get(type(module))

    def __call__(self, input: Tensor, target: Tensor, gather: Gather = None) -> Tensor:
        if self._fn is not None:  # the known losses are real functions
            for name, t in (("estimate", input), ("target", target)):
                if t.is_complex():  # (a cast would drop a complex target's imaginary part)
                    raise TypeError(f"{name} values must be real numbers for "
                                    f"{type(self.module).__name__}, got dtype {t.dtype}")
        if not (input.is_floating_point() or input.is_complex()):
            # An integer (or bool) estimate is promoted, as int / int is in torch: to the
            # target's floating dtype, else the default dtype (torch's losses refuse
            # integer inputs, or cast their float result back to the integer type).
            input = input.to(target.dtype if target.is_floating_point()
                             else torch.get_default_dtype())
        if input.dtype in (torch.float16, torch.bfloat16):
            # AMP: every criterion computes in float32 (the cast carries the gradient back).
            input = input.float()
        if target.dtype != input.dtype and input.is_floating_point():
            if target.is_complex():  # (the cast would drop its imaginary part)
                raise TypeError(f"target values must be real numbers for a real estimate "
                                f"({type(self.module).__name__}), got dtype {target.dtype}")
            # Ratings often come as float64 (numpy) for a float32 network.
            target = target.to(input.dtype)
        if self._fn is not None:
            return self._fn(self.module, input, target, gather)
        # A loss we do not know: its own forward, on a shallow copy made now
        # (it sees the module's current settings) so the caller's module keeps
        # its reduction.
        module: Any = copy.copy(self.module)
        module.reduction = "none"
        out = module(input, target)
        if not isinstance(out, Tensor) or out.shape != input.shape:
            raise TypeError(
                f"criterion {type(self.module).__name__} has no element-wise form: with "
                f"reduction='none' it returned shape {tuple(getattr(out, 'shape', ()))} "
                f"for an input of shape {tuple(input.shape)}")
        return out

    def __repr__(self) -> str:
        return repr(self.module)


def elementwise_loss(criterion: nn.Module) -> ElementwiseLoss:
    """Check that ``criterion`` is a loss with an element-wise form and wrap it.

    Raises:
        TypeError: ``criterion`` is not an ``nn.Module`` with a ``reduction``
            attribute, or is a loss with no element-wise form (class scores,
            pairs or triplets of inputs, a variance input).
    """
    if isinstance(criterion, ElementwiseLoss):
        return criterion
    if not isinstance(criterion, nn.Module):
        raise TypeError(f"criterion must be a loss module such as nn.MSELoss(), "
                        f"got {type(criterion).__name__}")
    if isinstance(criterion, _NO_ELEMENTWISE_FORM):
        raise TypeError(
            f"criterion {type(criterion).__name__} has no element-wise form; use a loss "
            "computed entry by entry (MSELoss, L1Loss, SmoothL1Loss, HuberLoss, BCELoss, "
            "BCEWithLogitsLoss, ...)")
    if not hasattr(criterion, "reduction"):
        raise TypeError(f"criterion must be a loss module with a 'reduction' attribute, "
                        f"got {type(criterion).__name__}")
    return ElementwiseLoss(criterion)


def reduction_of(criterion: Any) -> Any:
    """The wrapped loss's ``reduction`` (``'mean'`` when it has none)."""
    if isinstance(criterion, ElementwiseLoss):
        criterion = criterion.module
    return getattr(criterion, "reduction", "mean")


def resolve_size_average(criterion: nn.Module, size_average: Optional[bool],
                         owner: str, batchmean: bool = False) -> bool:
    """``size_average`` honouring the wrapped loss's ``reduction``.

    ``reduction='mean'`` (torch's default) leaves nnsparse's averaging as
    asked (default True); ``'sum'`` (and ``'batchmean'`` where the owner
    divides by the rows itself, ``batchmean=True``: :class:`SparseCriterion`)
    means ``size_average=False`` unless ``size_average=True`` was asked
    explicitly, which contradicts it; ``'none'`` is refused: an nnsparse
    criterion returns a scalar.  A refused ``'batchmean'`` is told the way round;
    ``'batchmean'`` on any loss but :class:`~torch.nn.KLDivLoss` is refused
    everywhere, as torch's own losses refuse it.
    """
    reduction = reduction_of(criterion)
    if size_average is not None:
        size_average = bool_arg(size_average, "size_average")
    if reduction == "mean":
        return True if size_average is None else size_average
    module = criterion.module if isinstance(criterion, ElementwiseLoss) else criterion
    kl_div = isinstance(module, nn.KLDivLoss)
    if reduction == "batchmean" and not kl_div:
        # torch's own losses other than KLDivLoss refuse it at their call
        # ("batchmean is not a valid value for reduction"): so does nnsparse
        name = type(module).__name__
        raise ValueError(f"{owner}: reduction='batchmean' is nn.KLDivLoss's only, got it on "
                         f"{name} (torch's {name} refuses it too); pass reduction='sum' and "
                         "divide the loss by the number of rows")
    if reduction == "sum" or (reduction == "batchmean" and batchmean):
        if size_average:
            raise ValueError(f"{owner}: the criterion's reduction={reduction!r} contradicts "
                             "size_average=True; keep one of them")
        return False
    hint = ("; for 'batchmean' (the sum divided by the batch's rows) pass reduction='sum' "
            "and divide the loss by the number of rows, or wrap the loss in SparseCriterion, "
            "which honours 'batchmean'" if reduction == "batchmean"
            else "; use size_average= to choose the averaging")
    also = ", or 'batchmean' for nn.KLDivLoss" if batchmean and kl_div else ""
    raise ValueError(f"{owner}: the criterion's reduction must be 'mean' or 'sum'{also} (an "
                     f"nnsparse criterion returns a scalar), got {reduction!r}{hint}")


def checked_loss(criterion: nn.Module, size_average: Optional[bool],
                 owner: str, batchmean: bool = False) -> ElementwiseLoss:
    """The element-wise form of ``criterion``, once ``size_average`` agrees with its
    ``reduction`` (both may have been assigned since the constructor): what a
    criterion's forward evaluates."""
    loss = elementwise_loss(criterion)
    resolve_size_average(criterion, size_average, owner, batchmean)
    return loss


# The keys of Lua nnsparse's SDAEconf table, as nnsparse names them.
_LUA_SETTINGS = {"noiseRatio": "noise_ratio", "noiseMean": "noise_mean", "noiseStd": "noise_std",
                 "flipRatio": "flip_ratio", "flipRange": "flip_range", "hideRatio": "hide_ratio"}

# Lua nnsparse's names of the criteria's settings and methods, as nnsparse names
# them: refused when assigned (a new attribute of that name would silently do
# nothing), and named in the error when read or passed to a constructor.
_LUA_NAMES = {"sizeAverage": "size_average", "fullSizeAverage": "full_size_average",
              "maskAlpha": "mask_alpha", "maskBeta": "mask_beta",
              # SDAESparseCriterion's per-row masks[k].alpha: mask_alpha[k] at row k's entries
              "masks": "mask_alpha",
              "SetAlpha": "alpha", "SetBeta": "beta",
              "prepareInput": "prepare_input", **_LUA_SETTINGS}


# What a read of a Lua name needs beyond nnsparse's name: Lua's masks[k].alpha was a
# vector over row k's entries, mask_alpha is a dense (rows, n) mask.
_LUA_NAME_NOTES = {
    "masks": (" and mask_beta: dense bool masks of the prepared batch's shape (rows, n), so "
              "Lua's masks[k].alpha (row k's entries) is mask_alpha[k][to_pairs(noisy)[k][:, "
              "0].long()], and the rows' masks concatenated are torch.cat of those over k "
              "(a list of pair tensors is as wide as its largest index + 1, maybe narrower "
              "than the dense input: index by pair indices, not by the input's pattern)"),
}


# What a port may call the settings mapping when passing it as a keyword
# (docs/lua_port.md writes SDAECriterion(criterion, conf)).
_CONF_KEYWORDS = ("conf", "sdaeconf", "sdae_conf")


def _ours(cls: type, lua: str) -> Optional[str]:
    """nnsparse's name of the Lua setting ``lua`` if criteria of class ``cls`` have
    it (an attribute, a method, or a constructor argument), else None."""
    ours = _LUA_NAMES.get(lua)
    if ours is None:
        return None
    if hasattr(cls, ours) or ours in inspect.signature(cls).parameters:
        return ours
    return None


class RefuseLuaNames:
    """Mixin: a Lua name of one of the criterion's settings (``crit.sizeAverage =
    False``, ``crit.maskAlpha``, ``SDAECriterion(mse, hideRatio=0.2)``) raises an
    error that names nnsparse's."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        lua = sorted((k, ours) for k in kwargs if (ours := _ours(cls, k)) is not None)
        if lua:
            key, ours = lua[0]
            mapping = (" (Lua's names are taken in a settings mapping, the SDAEconf form)"
                       if key in _LUA_SETTINGS else "")
            # (masks, maskAlpha, prepareInput: an attribute or method, never a keyword)
            named = (f"{ours}=" if ours in inspect.signature(cls).parameters
                     else f"{ours}, an attribute, not a constructor argument")
            raise TypeError(f"{cls.__name__}() got Lua's keyword {key!r}; nnsparse calls it "
                            f"{named}{mapping}")
        parameters = inspect.signature(cls).parameters if kwargs else {}
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        unknown = [] if takes_any else sorted(k for k in kwargs if k not in parameters)
        if unknown:
            # torch's own error names the private base class (_SDAEBase.__init__())
            key = unknown[0]
            if key.lower() in _CONF_KEYWORDS and "alpha" in parameters:
                raise TypeError(
                    f"{cls.__name__}() got the keyword {key!r}; the settings mapping (Lua's "
                    f"SDAEconf) is the second positional argument, {cls.__name__}(criterion, "
                    f"{{'hideRatio': ...}}), or pass the settings as keywords (hide_ratio=...)")
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {key!r}")
        return super().__new__(cls)

    def __setattr__(self, name: str, value: object) -> None:
        ours = _ours(type(self), name)
        if ours is not None:
            cls = type(self)
            ours_static = inspect.getattr_static(cls, ours, None)
            if ours in inspect.signature(cls).parameters:
                raise setting_error(self, name, ours, "criterion")
            if isinstance(ours_static, property):  # mask_alpha, mask_beta (Lua assigned them)
                how = "read-only, set by prepare_input(input)"
            else:  # prepare_input
                how = "a method, not a setting"
            raise AttributeError(f"{cls.__name__} has no Lua attribute {name!r}; nnsparse "
                                 f"calls it {ours}: {how}")
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            ours = _ours(type(self), name)
            if ours is None:
                hint = CRITERION_MEMBERS.get(name)
                if hint is None:
                    raise
                raise member_error(self, name, hint) from None
        raise AttributeError(f"{type(self).__name__} has no Lua attribute {name!r}; nnsparse "
                             f"calls it {ours}{_LUA_NAME_NOTES.get(name, '')}")


def real_arg(value: Any, name: str) -> float:
    """``value`` as a float, refused unless it is a finite real number."""
    if not is_real(value):  # (not a bool, nor a numpy timedelta64)
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    number = real_float(value)  # (10**400: inf, not float()'s OverflowError)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value}")
    return number


def weighted_sum(losses: Tensor, flagged: Tensor, alpha: float, beta: float) -> Tensor:
    """``alpha * sum(losses[flagged]) + beta * sum(losses[~flagged])``, sync-free (a weight
    an entry).  The weights must lie within the losses' floating dtype: torch's fill
    refuses one beyond it ("value cannot be converted to type float without overflow")."""
    if losses.is_floating_point():
        for name, value in (("alpha", alpha), ("beta", beta)):
            if not holds_exactly(losses.dtype, value):
                top = torch.finfo(losses.dtype).max
                raise ValueError(f"{name} must be a value the loss's dtype {losses.dtype} can "
                                 f"hold (in [{-top}, {top}]), got {value}")
    weight = torch.full_like(losses, beta).masked_fill_(flagged, alpha)
    return (losses * weight).sum()


def non_negative_arg(value: Any, name: str) -> float:
    """A finite real number >= 0: a loss weight (a negative one would reward
    errors) or a noise's standard deviation."""
    value = real_arg(value, name)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return cast(float, value)


def ratio_arg(value: Any, name: str) -> float:
    """A probability: a real number in [0, 1]."""
    value = real_arg(value, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return cast(float, value)


def bool_arg(value: Any, name: str) -> bool:
    return as_flag(value, name)  # a numpy bool passes, as a bool


def pair_arg(value: Any, name: str) -> Tuple[float, float]:
    """A pair of finite reals: a tuple, a list, or a 1-D tensor or array of two."""
    if isinstance(value, (Tensor, np.ndarray)) and value.ndim == 1:
        value = value.tolist()  # Lua's flipRange could be a tensor too
    if not isinstance(value, (tuple, list)):
        hint = ""
        if isinstance(value, (set, frozenset)):  # Lua's table {-99, 99} written as a set
            hint = " (a set has no order and merges equal values: write Lua's {a, b} as (a, b))"
        raise TypeError(f"{name} must be a pair (low, high), got {type(value).__name__} "
                        f"{value!r}{hint}")
    if len(value) != 2:
        raise ValueError(f"{name} must hold 2 values, got {value!r}")
    low, high = (real_arg(v, name) for v in cast(Sequence[Any], value))
    return (low, high)


T = TypeVar("T")


class Setting(Generic[T]):
    """A criterion's public setting, checked when assigned (in ``__init__`` and after).

    ``crit.alpha = a`` (Lua's ``SetAlpha``) runs the same check as the
    constructor; a refused assignment raises and leaves the old value.  What
    ties settings together (ratios summing to at most 1, the averaging modes,
    the wrapped loss's ``reduction``) is checked where they are used.
    """

    def __init__(self, check: Callable[[Any, str], T]) -> None:
        self._check = check
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: Optional[type] = None) -> "Setting[T]": ...

    @overload
    def __get__(self, obj: object, owner: Optional[type] = None) -> T: ...

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        try:  # kept in the instance's __dict__ under its own name (a data descriptor wins)
            return obj.__dict__[self._name]
        except KeyError:
            raise AttributeError(f"{type(obj).__name__} has no {self._name} yet") from None

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._name] = self._check(value, self._name)


def generator_arg(generator: Any, name: str = "generator") -> Optional[torch.Generator]:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    return generator


def conf_settings(conf: Mapping[str, Any], given: Dict[str, Any], defaults: Dict[str, Any],
                  owner: str, inert: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The settings of a criterion built Lua's way, ``Criterion(criterion, SDAEconf)``.

    ``conf`` maps Lua's keys (``hideRatio``) or nnsparse's (``hide_ratio``) to
    values; the settings it leaves out take their defaults.  ``given`` holds
    the settings passed as arguments too, which must then be the defaults:
    one setting from two places would leave the reader guessing which wins.
    ``inert`` names the SDAE settings the criterion has not (Lua's
    MaskCriterion reads one SDAEconf table and ignores them): each is
    skipped when it has no effect, its value there (``None``: any value).
    """
    clash = sorted(k for k, v in given.items() if not _is_default(v, defaults[k]))
    if clash:
        raise TypeError(f"{owner}: pass the settings either in one mapping (Lua's SDAEconf) or "
                        f"as keywords, not both; got a mapping and {', '.join(clash)}=")
    settings = dict(defaults)
    keys: Dict[str, Any] = {}  # the mapping's key that set each setting
    for key, value in conf.items():
        name = _LUA_SETTINGS.get(key, key)
        if inert is not None and name in inert:
            if inert[name] is not None and not _is_default(value, inert[name]):
                raise ValueError(f"{owner} has no {name} (it only hides entries): the "
                                 f"mapping's {key} must be {inert[name]}, got {value!r}; "
                                 f"SDAESparseCriterion adds noise and flips")
            continue
        if not isinstance(key, str) or name not in defaults:
            raise TypeError(f"{owner}: unknown setting {key!r} in the mapping; expected some of "
                            f"{', '.join(defaults)} (or Lua's camelCase names)")
        if name in keys and not _same_setting(settings[name], value):
            # {'hideRatio': 0.2, 'hide_ratio': 0.3}: the last one silently won
            raise ValueError(f"{owner}: the mapping gives {name} twice, as {keys[name]!r}: "
                             f"{settings[name]!r} and {key!r}: {value!r}; keep one of them")
        keys[name] = key
        settings[name] = value
    return settings


def _setting_kind(value: Any) -> str:
    """What :func:`_same_setting` compares ``value`` as: a bool, a real number (numpy's
    too), a pair (a list, tuple, array or tensor of one dimension or more), or its type."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Real):
        return "real"
    if isinstance(value, (list, tuple)) or (isinstance(value, (Tensor, np.ndarray))
                                            and value.ndim > 0):
        return "pair"
    return type(value).__name__  # None, a str, a 0-d tensor or array: equal as ==


def _same_setting(a: Any, b: Any) -> bool:
    """Whether two values a mapping gives one setting (under Lua's name and nnsparse's)
    are one value: equal and of one kind, whatever their order.  A pair counts as one in
    any form (``[-1, 1]``, ``(-1., 1.)``, ``torch.Tensor([-1, 1])``, an array); a bool
    is not the number 1 (the settings refuse bools), nor a 0-d tensor a float."""
    kind = _setting_kind(a)
    if kind != _setting_kind(b):
        return False
    try:
        if kind == "pair":
            return _floats(a) == _floats(b)
        if kind == "real" and math.isnan(a) and math.isnan(b):
            return True  # (refused by the setting's check, with its own message)
        return bool(a == b) and bool(b == a)
    except (TypeError, ValueError, RuntimeError):  # a nested list, a tensor's bool()
        return False


def _floats(pair: Any) -> Tuple[float, ...]:
    """A pair setting's values as floats, in whatever form it came."""
    items = pair.tolist() if isinstance(pair, (Tensor, np.ndarray)) else pair
    return tuple(float(v) for v in items)


def _is_default(value: Any, default: Any) -> bool:
    """``value == default`` for a setting of any kind (a pair as a tuple, list or array)."""
    if value is default:
        return True
    try:
        if isinstance(default, tuple):
            return tuple(float(v) for v in value) == default
        return bool(value == default)
    except (TypeError, ValueError, RuntimeError):  # an array's ==, a str's float()
        return False
