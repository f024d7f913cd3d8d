"""Lazy optimisers: a step touches only the parameter entries a batch used.

With sparse gradients (``SparseLinearBatch(sparse_grad=True)`` for an
encoder, ``SparseOutputLinear(sparse_grad=True)`` for a decoder) a batch of
ratings touches a few columns of the encoder's weight and a few rows of the
decoder's; :class:`LazyAdam` updates those entries and their moment estimates
only, so the step costs in proportion to the touched entries, not to the
catalogue.  Dense gradients (a bias, or a layer in dense mode) get the plain
Adam update, so one optimiser serves the whole model.  :func:`clip_grad_norm_`
and :func:`clip_grad_value_` are torch's gradient clipping, taking sparse
gradients too.
"""
from __future__ import annotations

import math
import numbers
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import MutableMapping
from typing import (TYPE_CHECKING, Any, Callable, DefaultDict, Dict, Iterable, Iterator, List,
                    Optional, Tuple, Union, cast, overload)

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.optimizer import required


from . import _grad_origin, _rowopt
from ._clip import clip_grad_norm_, clip_grad_value_
from ._forms import _a, as_choice, as_flag, check_real, is_real, real_float, refuse_meta

if TYPE_CHECKING:  # at run time _sparse_layers imports them itself
    from .layers.linear import SparseLinearBatch
    from .layers.sparse_output import SparseOutputLinear

__all__ = ["LazyAdam", "InBackwardOptimizer", "apply_optimizer_in_backward",
           "fused_step_optimizer", "clip_grad_norm_", "clip_grad_value_", "DENSE_ABOVE"]

# The touched share of a table's rows above which fused_step_optimizer takes
# the dense step: measured on CPU (1 thread, a 20,000 x 500 float32 Adam table,
# the gradient rows made by the backward): the lazy update of 5% of the rows
# took 4.2 ms, of 10% 12.2 ms, the dense one 8.0-8.5 ms whatever the share.
DENSE_ABOVE = 0.1

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
    ``nn.Embedding``, :class:`nnsparse.SparseOutputLinear` and
    ``SparseLinearBatch`` (over the rows of its ``weight_t``) give, or a 2-D
    COO one over single entries) only the specified entries are read and
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

    State, per parameter: ``step`` (a Python int: the number of steps that
    parameter took; ``torch.optim.Adam`` keeps a float32 tensor, which
    :meth:`load_state_dict` turns into the int, as Adam turns an int into its
    tensor), ``exp_avg`` and ``exp_avg_sq`` (the parameter's shape).

    Args:
        params: parameters or parameter groups.
        lr (float): learning rate.  Default: ``1e-3``.
        betas (Tuple[float, float]): decay rates of the first and second
            moments.  Default: ``(0.9, 0.999)``.
        eps (float): added to the denominator.  Default: ``1e-8``.
        weight_decay (float): lazy weight decay, see above.  Default: ``0``.
        decoupled_weight_decay (bool): AdamW-style decay.  Default: ``False``.
        dense_above (float, optional): when a row-sparse gradient touches more
            than this share of a parameter's rows, the step is torch's dense
            fused Adam/AdamW over the whole parameter (the gradient
            zero-filled: untouched rows' moments decay and the rows move, as
            in Adam), which costs less than gathering most rows.  ``None``:
            always lazy.  Default: ``None``.

    Raises:
        TypeError: ``params`` is a tensor or not iterable; ``lr``, ``eps``,
            ``weight_decay`` not numbers, ``betas`` not a pair,
            ``decoupled_weight_decay`` not a bool.
        ValueError: a negative ``lr``, ``eps`` or ``weight_decay``, ``betas``
            outside ``[0, 1)``, ``dense_above`` outside ``[0, 1]``, no parameters
            (torch's refusal).  :meth:`step` raises its own.

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
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False,
                 dense_above: Optional[float] = None) -> None:
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            _check_non_negative(name, value)
        _check_betas(betas)
        _check_share(dense_above)
        decoupled_weight_decay = as_flag(decoupled_weight_decay, "decoupled_weight_decay")
        if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
            raise TypeError(f"params must be an iterable of parameters or of param-group "
                            f"dicts, got {type(params).__name__}")
        if isinstance(params, Tensor):  # torch's own message fails on a sparse tensor's type
            raise TypeError(f"params must be an iterable of parameters or of param-group "
                            f"dicts, got a tensor ({params.layout}, shape "
                            f"{tuple(params.shape)}); pass [tensor]")
        defaults = _hyper_numbers(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       decoupled_weight_decay=decoupled_weight_decay,
                                       dense_above=dense_above))
        super().__init__(params, defaults)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """``Optimizer.add_param_group`` with the constructor's checks on the group's
        hyperparameters (torch's would take a negative ``lr`` or ``maximize=True``)."""
        if isinstance(param_group, dict):
            if "params" not in param_group:  # torch's KeyError
                raise ValueError(f"param_group must have 'params', got the keys "
                                 f"{sorted(map(str, param_group))}")
            _check_lazy_group({**self.defaults, **param_group}, "param_group")
            param_group = _hyper_numbers({**param_group,
                                          "params": _unique_params(param_group["params"])})
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """``Optimizer.load_state_dict`` of a :class:`LazyAdam` or ``torch.optim.Adam`` /
        ``AdamW`` state, checked first (torch loads any shape, and the next step
        would fail half-way): each entry's ``step``, ``exp_avg`` and ``exp_avg_sq``,
        of its parameter's shape, and the groups' hyperparameters.  The keys of this
        optimiser's :attr:`defaults` a group lacks (a torch Adam state has no
        ``dense_above``; a subclass's own defaults, a state saved before it added them)
        take their default, as ``add_param_group`` fills a new group (one without a
        default, ``torch.optim.optimizer.required``, is refused); a group gets no
        other key (not torch's ``differentiable``, which its load adds to the
        defaults).  The step count is kept as a Python int whatever form it comes
        in (an int, a whole float, a one-element tensor such as torch's float32
        one), as :meth:`step` keeps it; ``torch.optim.Adam`` loads such a state
        too (it makes its own tensor of the count).

        Entries are matched to parameters through the saved groups' ids, as
        torch matches them.  Refused, before anything is loaded, where torch
        would load them: an entry for an id no saved group names, an id named
        twice, an entry holding another optimiser's keys (NAdam's
        ``mu_product``), a negative ``exp_avg_sq``, moments of another shape."""
        _check_state_entries(state_dict, self, "state_dict", _state_keys(self))
        groups = state_dict["param_groups"]
        for i, group in enumerate(groups if isinstance(groups, list) else []):
            if isinstance(group, dict):
                _check_lazy_group({**self.defaults, **group}, f"state_dict['param_groups'][{i}]")
                # a subclass's hyperparameter without a default: add_param_group's refusal
                # (filled below, the group would hold torch's placeholder as its value)
                lacking = sorted(str(key) for key, value in self.defaults.items()
                                 if value is required and key not in group)
                if lacking:
                    raise ValueError(f"state_dict['param_groups'][{i}] must hold {lacking}, "
                                     f"hyperparameters of {type(self).__name__} without a "
                                     f"default (torch.optim.optimizer.required), got the keys "
                                     f"{sorted(map(str, group))}")
        super().load_state_dict(state_dict)
        # LazyAdam's own keys (a torch Adam state has no dense_above), then those a
        # subclass added to its defaults (a state saved before it had them), as torch's
        # add_param_group fills a group; not torch's "differentiable", which its load (and
        # a copy) adds to the defaults: a group reloaded from its own state gained the key
        keys = _LAZY_KEYS + tuple(key for key in self.defaults
                                  if key not in _LAZY_KEYS and key not in _TORCH_ADDED)
        for group in self.param_groups:
            for key in keys:
                group.setdefault(key, self.defaults[key])
        for entry in self.state.values():
            # torch.optim.Adam's float32 tensor, a float, a numpy number: the int a step
            # advances (checked above to be a whole number >= 0)
            if "step" in entry:
                entry["step"] = _step_count(entry["step"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``Optimizer.zero_grad``, ``set_to_none`` checked to be a bool (torch's takes any
        value by its truth: ``"no"`` or a one-element tensor set the gradients to None,
        a larger tensor failed with "Boolean value of Tensor ... is ambiguous")."""
        super().zero_grad(as_flag(set_to_none, "set_to_none"))

    def _checked_work(self) -> List[Tuple[Tensor, Tensor, Dict[str, Any]]]:
        """The ``(parameter, gradient, group)`` a step updates, every group and gradient
        checked first: a refused step changes nothing (nor, in a
        :class:`~nnsparse.SplitOptimizer`, the other parts)."""
        for i, group in enumerate(self.param_groups):  # e.g. an lr set to -1 since
            _check_lazy_group(group, f"param_groups[{i}]", values=False)
            for j, p in enumerate(group["params"]):  # e.g. replaced since by hand
                if not isinstance(p, Tensor) or not (p.is_floating_point() or p.is_complex()):
                    got = p.dtype if isinstance(p, Tensor) else type(p).__name__
                    raise TypeError(f"param_groups[{i}]['params'][{j}] must be a "
                                    f"floating-point tensor, got {got}")
                if p.grad is not None:  # a step reads it (torch's "Tensor.item() cannot be
                    # called on meta tensors" named no parameter)
                    refuse_meta(p, f"param_groups[{i}]['params'][{j}]")
        work = [(p, p.grad, group) for group in self.param_groups for p in group["params"]
                if p.grad is not None]
        for p, grad, _ in work:
            _check_grad(p, grad)
            _check_moments_fit(p, self.state.get(p))
        # the gradients nnsparse's layers made are in range by construction: checking
        # them would read back to the host (a GPU synchronisation) at every step
        _check_grad_indices([(f"param_groups[{i}]['params'][{j}]", p.grad)
                             for i, group in enumerate(self.param_groups)
                             for j, p in enumerate(group["params"])
                             if p.grad is not None and p.grad.layout == torch.sparse_coo
                             and not _grad_origin.known_in_range(p.grad)])
        return work

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Perform one optimisation step (see the class docstring).

        Every gradient is checked before any parameter or state changes: a
        refused step changes nothing.

        Raises:
            ValueError: a gradient of another shape, dtype or device than its
                parameter (the parameter changed since), or a sparse gradient
                with an index outside the parameter's shape (a hand-set one:
                ``torch.sparse_coo_tensor`` checks none by default; the gradients
                nnsparse's sparse-gradient layers make are in range by
                construction and not read: their step reads nothing back to the
                host, on a GPU no synchronisation), or a parameter with a gradient
                on the meta device (it holds no data to update).
            NotImplementedError: a gradient of another layout than strided or
                sparse COO, or a sparse one with a ``sparse_dim`` other than 1
                (or 2 for a 2-D parameter).
        """
        loss = _closure_loss(closure)
        for p, grad, group in self._checked_work():
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            for key in ("exp_avg", "exp_avg_sq"):  # e.g. loaded from a state_dict: p's layout
                if state[key].stride() != p.stride():
                    state[key] = torch.empty_like(p).copy_(state[key])
            state["step"] += 1
            _update(p, grad, state, group)
        return loss


def _unique_params(params: Any) -> Any:
    """``params`` (a group's) as a list, refused if it names one parameter twice (torch
    only warns, and each step would then update that parameter twice) or holds an
    integer, bool or sparse tensor.  A tensor or a set is left for torch's own checks."""
    if isinstance(params, (Tensor, set)) or not hasattr(params, "__iter__"):
        return params
    params = list(params)
    seen: Dict[int, int] = {}
    for i, item in enumerate(params):
        # torch's named form, (name, parameter) pairs (model.named_parameters()), too
        named = isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
        p = item[1] if named else item
        if isinstance(p, Tensor) and p.layout != torch.strided:
            # torch takes it, and the first step fails on its strides (or writes nothing)
            raise TypeError(f"params must be dense (strided) tensors, got layout {p.layout} at "
                            f"position {i}; LazyAdam takes sparse gradients of dense parameters")
        if isinstance(p, Tensor) and not (p.is_floating_point() or p.is_complex()):
            # torch takes it, and its first step fails in a kernel ("lerp ... 'Long'")
            raise TypeError(f"params must be floating-point tensors (Adam's moments), got "
                            f"{p.dtype} at position {i}")
        if id(p) in seen:
            raise ValueError(f"params must name each parameter once, got the same tensor at "
                             f"positions {seen[id(p)]} and {i} (each step would update it twice)")
        seen[id(p)] = i
    return params


# torch.optim.Adam's switches that LazyAdam does not implement: refused when on
_ADAM_ONLY = ("amsgrad", "maximize")


def _check_lazy_group(group: Dict[str, Any], where: str, values: bool = True) -> None:
    """The hyperparameters of a :class:`LazyAdam` parameter group, as its constructor
    checks them.  ``values=False`` (at each step) leaves out comparisons of a
    tensor ``lr`` (a host synchronisation on a GPU)."""
    for key in _ADAM_ONLY:
        if group.get(key):
            raise ValueError(f"{where}: LazyAdam has no {key}, got {key}={group[key]!r}; "
                             f"use torch.optim.Adam")
    for key in ("lr", "eps", "weight_decay"):
        if key not in group:
            raise ValueError(f"{where} must have {key!r}")
        value = group[key]
        if values or not isinstance(value, Tensor):
            _check_non_negative(f"{where}[{key!r}]", value)
        else:
            check_real(f"{where}[{key!r}]", value)
    _check_betas(group.get("betas"), f"{where}: betas")
    _check_share(group.get("dense_above"), f"{where}: dense_above")
    as_flag(group.get("decoupled_weight_decay"), f"{where}['decoupled_weight_decay']")


def _check_torch_groups(state_dict: Dict[str, Any], opt: Optimizer, where: str) -> None:
    """The common hyperparameters of a torch part's saved groups, as torch's constructors
    check them: ``lr``, ``eps``, ``weight_decay``, ``momentum`` non-negative (and not NaN
    nor infinite), a pair of ``betas`` in ``[0, 1)``.  torch's load takes any, and a
    negative ``lr`` loaded into the ``torch.optim.Adam`` part of a
    :class:`~nnsparse.SplitOptimizer` or of an :class:`InBackwardOptimizer` then ascended
    the loss at each step, where a LazyAdam refuses it (its own load checks its groups).

    Only numbers (Python or numpy reals, tensors: torch takes a tensor ``lr`` and
    ``betas``) are checked: a part may be any ``Optimizer``, whose keys of the same names
    can hold other things (``torch.optim.Adafactor``'s ``eps`` is a pair holding
    ``None``, some optimisers outside torch take three ``betas``), left to it."""
    groups = state_dict.get("param_groups")
    if isinstance(opt, LazyAdam) or not isinstance(groups, list):
        return  # (a list's absence: torch's own checks answer)

    def number(value: Any) -> bool:
        return is_real(value) or isinstance(value, Tensor)

    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            continue
        at = f"{where}['param_groups'][{i}]"
        for key in ("lr", "eps", "weight_decay", "momentum"):
            if number(group.get(key)):
                _check_non_negative(f"{at}[{key!r}]", group[key])
        betas = group.get("betas")
        if isinstance(betas, (tuple, list)) and len(betas) == 2 and all(map(number, betas)):
            _check_betas(betas, f"{at}: betas")


def _check_state_entries(state_dict: Any, optimizer: Optimizer, where: str,
                         required: Tuple[str, ...] = ()) -> None:
    """The per-parameter entries of an ``Optimizer.state_dict()`` against the parameters
    of ``optimizer``, each entry found through the saved groups' parameter ids as torch
    maps them: each tensor of more than 0 dimensions must have its parameter's shape
    (torch loads any, and a fused step then writes out of bounds), or, 0-d too, the shape
    its optimiser keeps for that key (:data:`_OTHER_SHAPES`: Adafactor's factors, LBFGS's
    flat vectors), a ``step`` must be a
    whole number >= 0, and a non-empty entry must hold the ``required`` keys, its
    moments (the required keys but ``step``) as dense tensors of the parameter's shape,
    and no key of another optimiser's state.  An entry for no saved id, a saved id
    named twice and an entry that is not a dict are refused (torch keeps the first as
    it is, maps the second to the wrong parameter and fails at the step on the third)."""
    _check_optimizer_dict(state_dict, where)
    params = _saved_ids(state_dict, optimizer, where)
    if params is None:
        return  # the groups do not match: torch's own checks (group sizes) answer
    state = state_dict["state"]
    if not isinstance(state, dict):
        raise TypeError(f"{where}['state'] must be a dict of parameter id -> state, got "
                        f"{type(state).__name__}")
    allowed = _allowed_keys(optimizer, required)
    for index, entry in state.items():
        name = f"{where}['state'][{index!r}]"
        if index not in params:
            raise ValueError(f"{where}['state'] has an entry {index!r} for no parameter: the "
                             f"ids of {where}['param_groups'] are {_ids_text(params)}")
        if not isinstance(entry, dict):
            raise TypeError(f"{name} must be a dict of state name -> value, got "
                            f"{type(entry).__name__}")
        missing = [key for key in required if key not in entry]
        if entry and missing:
            raise ValueError(f"{name} must hold {list(required)}, got the keys {sorted(entry)}")
        foreign = sorted(str(key) for key in entry if key not in allowed) if allowed else []
        if foreign:
            raise ValueError(f"{name} holds {foreign}, which {type(optimizer).__name__} does "
                             f"not keep (it keeps {sorted(allowed)}): the state of another "
                             f"optimiser")
        if "step" in entry:
            _check_step(entry["step"], f"{name}['step']")
        shape = tuple(params[index].shape)
        for key, t in entry.items():
            if key == "step":
                continue
            if key in required:  # a moment: a dense tensor of the parameter's shape
                _check_moment(t, shape, f"{name}[{key!r}]")
            elif isinstance(t, Tensor):
                _check_fits(t, optimizer, key, params[index], f"{name}[{key!r}]")
                _check_state_tensor(t, f"{name}[{key!r}]")
            if key in _SQUARES and isinstance(t, Tensor):
                _check_squares(t, f"{name}[{key!r}]")


def _saved_ids(state_dict: Dict[str, Any], optimizer: Optimizer, where: str
               ) -> Optional[Dict[Any, Tensor]]:
    """torch's map of the saved parameter ids to ``optimizer``'s parameters (group by
    group, in order), or ``None`` when the saved groups do not match in number or size."""
    groups = state_dict["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != len(optimizer.param_groups):
        return None
    found: Dict[Any, Tensor] = {}
    for i, (saved, own) in enumerate(zip(groups, optimizer.param_groups)):
        ids = saved.get("params") if isinstance(saved, dict) else None
        if not isinstance(ids, (list, tuple)):
            raise TypeError(f"{where}['param_groups'][{i}]['params'] must be a list of "
                            f"parameter ids (from Optimizer.state_dict()), got "
                            f"{type(ids).__name__}")
        if len(ids) != len(own["params"]):
            return None
        for k, (pid, p) in enumerate(zip(ids, own["params"])):
            try:
                seen = pid in found
            except TypeError:  # unhashable
                raise TypeError(f"{where}['param_groups'][{i}]['params'][{k}] must be a "
                                f"parameter id (an int), got {type(pid).__name__}") from None
            if seen and found[pid] is not p:  # torch saves a repeated parameter's id twice
                raise ValueError(f"{where}['param_groups'] must name each parameter id once, "
                                 f"got {pid!r} twice (torch would load one entry into two "
                                 f"parameters)")
            found[pid] = p
    return found


def _ids_text(ids: Dict[Any, Tensor]) -> str:
    keys = [repr(k) for k in ids]
    return "[" + ", ".join(keys[:8]) + (", ...]" if len(keys) > 8 else "]")


# State keys that hold sums of squares (never negative)
_SQUARES = ("exp_avg_sq", "max_exp_avg_sq", "sum")


def _check_squares(t: Tensor, name: str) -> None:
    """A loaded sum of squared gradients is non-negative: torch loads a negative one, and
    the next step's square root makes the parameter NaN (one pass at load time)."""
    if t.numel() and not t.is_complex() and bool((t < 0).any()):
        raise ValueError(f"{name} must be non-negative (a sum of squared gradients), "
                         f"got min {t.min().item()}")


def _check_optimizer_dict(state_dict: Any, where: str) -> None:
    """The form of an ``Optimizer.state_dict()`` (torch's load raises AttributeError or
    KeyError): a dict with ``'state'`` and ``'param_groups'``."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"{where} must be a dict (from Optimizer.state_dict()), "
                        f"got {type(state_dict).__name__}")
    missing = [key for key in ("state", "param_groups") if key not in state_dict]
    if missing:
        raise ValueError(f"{where} must have the keys 'state' and 'param_groups' (from "
                         f"Optimizer.state_dict()), lacks {missing}")


def _check_step(step: Any, name: str) -> None:
    """An entry's step count: a number or a one-element tensor (torch's Adam keeps a float
    one) holding a whole number >= 0 (a negative or fractional count gives a wrong bias
    correction, a NaN one NaN parameters)."""
    value = step
    if isinstance(step, Tensor) and (step.layout != torch.strided or step.device.type == "meta"):
        where = "on the meta device" if step.layout == torch.strided else f"of layout {step.layout}"
        raise TypeError(f"{name} must be a number or a dense one-element tensor, got a tensor "
                        f"{where}")
    if isinstance(step, Tensor) and step.numel() == 1 and not step.is_complex():
        value = step.item()
    if not is_real(value):  # (not a bool, nor a numpy timedelta64)
        raise TypeError(f"{name} must be a number or a one-element tensor, "
                        f"got {type(step).__name__} {step!r}")
    count = real_float(value)  # a Real converts (10**400: inf, no OverflowError)
    if not (math.isfinite(count) and count >= 0 and count.is_integer()):
        raise ValueError(f"{name} must be a whole number >= 0, got {value}")


def _step_count(step: Any) -> int:
    """A checked step count (:func:`_check_step`) as a Python int."""
    return int(step.item() if isinstance(step, Tensor) else step)


def _check_moment(t: Any, shape: Tuple[int, ...], name: str) -> None:
    """A moment of a state entry: a dense real tensor of its parameter's shape."""
    if not isinstance(t, Tensor) or t.layout != torch.strided:
        kind = f"layout {t.layout}" if isinstance(t, Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a dense tensor of its parameter's shape {shape}, "
                        f"got {kind}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have its parameter's shape {shape}, "
                         f"got {tuple(t.shape)}")
    _check_state_tensor(t, name)


def _check_state_tensor(t: Tensor, name: str) -> None:
    """A loaded state tensor holds real data: torch copies a meta tensor's "data" (it
    fails half-way through a load) and casts complex values to the parameter's real
    dtype, dropping the imaginary part with a warning only."""
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense tensor, got layout {t.layout}")
    if t.device.type == "meta":
        raise ValueError(f"{name} must hold data, got a tensor on the meta device")
    if t.is_complex():
        raise TypeError(f"{name} must be a real tensor, got {t.dtype}")


# The state keys of torch's optimisers (and LazyAdam) that nnsparse builds: a non-empty
# entry must hold them, the moments as dense tensors of the parameter's shape.
_STATE_KEYS: Dict[type, Tuple[str, ...]] = {
    torch.optim.Adam: ("step", "exp_avg", "exp_avg_sq"),
    torch.optim.AdamW: ("step", "exp_avg", "exp_avg_sq"),
    torch.optim.SparseAdam: ("step", "exp_avg", "exp_avg_sq"),
    torch.optim.Adagrad: ("step", "sum"),
    torch.optim.SGD: ("momentum_buffer",),
}


def _factor(p: Tensor, dim: int) -> Tuple[int, ...]:
    """``p``'s shape with 1 at ``dim``: a factor of ``torch.optim.Adafactor``'s second
    moment for a parameter of 2 or more dimensions (a vector's is its ``variance``)."""
    shape = list(p.shape)
    if len(shape) >= 2:
        shape[dim] = 1
    return tuple(shape)


def _adafactor_row(p: Tensor, optimizer: Optimizer) -> Tuple[Tuple[int, ...], str]:
    return _factor(p, -1), f"Adafactor's row factor for a parameter of shape {tuple(p.shape)}"


def _adafactor_col(p: Tensor, optimizer: Optimizer) -> Tuple[Tuple[int, ...], str]:
    return _factor(p, -2), f"Adafactor's column factor for a parameter of shape {tuple(p.shape)}"


def _lbfgs_flat(p: Tensor, optimizer: Optimizer) -> Tuple[Tuple[int, ...], str]:
    # LBFGS keeps its whole state on its first parameter: vectors over its first group's
    # parameters' entries flattened (its _params: a group added later is not in them), a
    # complex one's as two reals (torch's _numel)
    n = sum(q.numel() * (2 if q.is_complex() else 1) for q in optimizer.param_groups[0]["params"])
    return (n,), f"LBFGS's flat vector of its parameters' {n} entries"


# The state tensors of torch's optimisers that do not have their parameter's shape:
# class (its subclasses too) -> key -> the shape expected of a parameter's entry, and what
# that tensor is (for the message).  Any other tensor of more than 0 dimensions has its
# parameter's shape.
_OTHER_SHAPES: Dict[type, Dict[str, Callable[[Tensor, Optimizer],
                                            Tuple[Tuple[int, ...], str]]]] = {
    torch.optim.Adafactor: {"row_var": _adafactor_row, "col_var": _adafactor_col},
    torch.optim.LBFGS: {"d": _lbfgs_flat, "prev_flat_grad": _lbfgs_flat},
}


def _check_fits(t: Tensor, optimizer: Optimizer, key: str, p: Tensor, name: str) -> None:
    """A loaded state tensor ``t`` (``key`` of parameter ``p``'s entry) has the shape
    ``optimizer`` keeps there: the one :data:`_OTHER_SHAPES` gives, 0-d or not (a 0-d
    ``row_var`` or ``d`` loaded, and the step failed in torch's broadcast or ``dot``), or
    else, unless 0-d (a step, ``mu``, ``eta``, ``H_diag``), its parameter's."""
    for cls in type(optimizer).__mro__:
        shape_of = _OTHER_SHAPES.get(cls, {}).get(key)
        if shape_of is not None:
            expected, what = shape_of(p, optimizer)
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} must have the shape {expected} ({what}), "
                                 f"got {tuple(t.shape)}")
            return
    if t.dim() > 0 and tuple(t.shape) != tuple(p.shape):
        raise ValueError(f"{name} must have its parameter's shape {tuple(p.shape)}, "
                         f"got {tuple(t.shape)}")


# The keys the state of these optimisers may hold besides the required ones
_OPTIONAL_KEYS: Dict[type, Tuple[str, ...]] = {
    torch.optim.Adam: ("max_exp_avg_sq",),
    torch.optim.AdamW: ("max_exp_avg_sq",),
}


def _allowed_keys(optimizer: Optimizer, required: Tuple[str, ...]) -> Tuple[str, ...]:
    """The keys an entry of ``optimizer``'s state may hold; ``()``: any (an optimiser
    nnsparse does not know)."""
    if not required:
        return ()
    return required + _OPTIONAL_KEYS.get(type(optimizer), ())


def _state_keys(optimizer: Optimizer) -> Tuple[str, ...]:
    """The keys :func:`_check_state_entries` requires of ``optimizer``'s entries."""
    if isinstance(optimizer, LazyAdam):
        return ("step", "exp_avg", "exp_avg_sq")
    return _STATE_KEYS.get(type(optimizer), ())


def _check_moments_fit(p: Tensor, state: Optional[Dict[str, Any]]) -> None:
    """The moments of a stepped parameter still fit it (free: metadata only).  A
    parameter resized, converted or moved since (``p.data = ...``) would make the
    fused kernels read and write out of bounds or mix dtypes."""
    for key in ("exp_avg", "exp_avg_sq"):
        t = state.get(key) if state else None
        if isinstance(t, Tensor) and (t.shape != p.shape or t.dtype != p.dtype
                                      or t.device != p.device):
            raise RuntimeError(
                f"LazyAdam: the state of a parameter is {tuple(t.shape)} {t.dtype} on "
                f"{t.device}, the parameter is now {tuple(p.shape)} {p.dtype} on {p.device} "
                f"(changed after the optimiser's first step); resize, convert or move the "
                f"model before building the optimiser, or build it again")


def _check_grad(p: Tensor, grad: Tensor) -> None:
    """Raise unless :meth:`LazyAdam.step` can apply ``grad`` to ``p``."""
    if grad.shape != p.shape:
        raise ValueError(f"the gradient of a parameter of shape {tuple(p.shape)} must have "
                         f"its shape, got {tuple(grad.shape)}")
    if grad.device != p.device or grad.dtype != p.dtype:
        raise ValueError(f"the gradient must have its parameter's dtype and device "
                         f"({p.dtype}, {p.device}), got ({grad.dtype}, {grad.device})")
    if grad.layout not in (torch.strided, torch.sparse_coo):
        raise NotImplementedError(f"LazyAdam supports strided and sparse COO gradients, "
                                  f"got layout {grad.layout}")
    if grad.layout == torch.sparse_coo and not p.is_contiguous():
        raise NotImplementedError("LazyAdam needs a contiguous parameter for a sparse "
                                  f"gradient, got strides {p.stride()}")
    if grad.layout == torch.sparse_coo and grad.sparse_dim() != 1 and not (
            p.dim() == 2 and grad.sparse_dim() == 2):
        raise NotImplementedError(f"LazyAdam supports sparse gradients with one sparse "
                                  f"dimension, or two for a 2-D parameter, got sparse_dim "
                                  f"{grad.sparse_dim()} for {_a(str(p.dim()))}-D parameter")


def _check_grad_indices(grads: List[Tuple[str, Tensor]]) -> None:
    """Raise unless the indices of the sparse gradients ``(where, grad)`` lie in their
    shape: a hand-set ``p.grad`` (``torch.sparse_coo_tensor`` checks no index by
    default) would otherwise update other entries, or write out of bounds.

    One ``aminmax`` per gradient and one read back per device and step for them all;
    measured at under 2% of a ``LazyAdam`` step of the MovieLens-1M autoencoder
    (docs/optim_checks.md).  The caller leaves out the gradients nnsparse's layers
    made (:mod:`nnsparse._grad_origin`), so a step of theirs reads nothing back.
    """
    found = [(where, g._indices(), tuple(g.shape)) for where, g in grads if g._nnz() > 0]
    by_device: Dict[torch.device, List[int]] = {}
    for k, (_, index, _) in enumerate(found):
        by_device.setdefault(index.device, []).append(k)
    for ks in by_device.values():
        # per gradient: the minima of its sparse dimensions, then their maxima
        bounds = torch.cat([torch.stack(found[k][1].aminmax(dim=1)).flatten()
                            for k in ks]).tolist()
        for k in ks:
            where, index, shape = found[k]
            sd = index.shape[0]
            lows, highs, bounds = bounds[:sd], bounds[sd:2 * sd], bounds[2 * sd:]
            for d, (lo, hi) in enumerate(zip(lows, highs)):
                if lo < 0 or hi >= shape[d]:
                    got = f"min {lo}" if lo < 0 else f"max {hi}"
                    raise ValueError(f"the sparse gradient of {where} must have indices in "
                                     f"[0, {shape[d]}) in dimension {d} (its shape "
                                     f"{shape}), got {got}")


def _update(p: Tensor, grad: Tensor, state: Dict[str, Any], group: Dict[str, Any]) -> None:
    """Dispatch on the gradient's layout: all entries, rows, columns or single entries."""
    m, v = state["exp_avg"], state["exp_avg_sq"]
    step = state["step"]
    if p.numel() == 0:
        # a layer of no inputs or outputs (SparseOutputLinear(0, n)): nothing to update;
        # its hybrid gradient's (nnz, 0) values cannot be viewed as rows of width 0
        return
    if grad.layout == torch.strided:
        if grad.stride() != p.stride():  # the fused kernel pairs elements by memory order
            grad = torch.empty_like(p).copy_(grad)
        _adam(p, grad, m, v, step, group)
        return
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
    # single entries: rows of width 1 of the flattened parameter
    _rows(p.view(-1, 1), index[0] * p.shape[1] + index[1], values.unsqueeze(1),
          m.view(-1, 1), v.view(-1, 1), step, group)


def _coalesced(grad: Tensor) -> Tuple[Tensor, Tensor]:
    """Indices and values with distinct positions in row-major order.

    Autograd hands over a sparse gradient without its "coalesced" flag even
    when a layer built it coalesced; an O(nnz) check spares the sort then, and
    a gradient marked as one of nnsparse's layers made it (coalesced) needs
    neither (:mod:`nnsparse._grad_origin`: the check reads back to the host).
    """
    if not (grad.is_coalesced() or _grad_origin.known_coalesced(grad)):
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


def _kernel_args(group: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """The row-update kind and hyperparameters (``nnsparse._rowopt``) of a LazyAdam group."""
    kind = "adamw" if group["decoupled_weight_decay"] else "adam"
    # (a group edited after the checks: eps, weight_decay and betas the kernels take as numbers)
    # converted only when _number would change one: never for a group the constructor made,
    # an int weight_decay=0 or an np.float64 (a float) included
    hp = {k: group[k] for k in ("lr", "betas", "eps", "weight_decay", "dense_above")}
    betas = () if _tensor_pair(hp["betas"]) else hp["betas"]  # a tensor pair is kept
    if not all(isinstance(v, (float, int)) for v in (hp["eps"], hp["weight_decay"], *betas)):
        hp = _hyper_numbers(hp)
    if not _USE_FUSED:  # the tests' switch: torch's single-tensor loop
        hp["_fused"] = False
    return kind, hp


def _step_before(step: int, device: torch.device) -> Tensor:
    """torch's Adam advances the step tensor itself: it is handed ``step - 1``
    (made by a fill on the device: no host-to-device copy, no sync on CUDA)."""
    return torch.full((), float(step - 1), device=device)


def _adam(p: Tensor, g: Tensor, m: Tensor, v: Tensor, step: int, group: Dict[str, Any]) -> None:
    """Adam/AdamW in place on tensors laid out alike (``g``, ``m``, ``v`` with ``p``'s
    strides): the row updates' kernel, torch's fused one where torch has one."""
    kind, hp = _kernel_args(group)
    _rowopt.KERNELS[kind](hp, p, g, [m, v], _step_before(step, p.device))


def _rows(p: Tensor, rows: Tensor, values: Tensor, m: Tensor, v: Tensor, step: int,
          group: Dict[str, Any]) -> None:
    """Update the rows ``rows`` (distinct, increasing) of 2-D ``p``; ``values`` are their
    gradients: the row update of the in-backward optimiser (touched rows gathered in
    blocks, one fused Adam pass each, scattered back; spans touched densely are updated
    in place and their untouched rows restored)."""
    kind, hp = _kernel_args(group)
    state = {"step": _step_before(step, p.device), "exp_avg": m, "exp_avg_sq": v}

    def dense_grad(lo: int, hi: int) -> Tensor:  # the gradient of rows lo:hi, zero-filled
        if lo == 0 and hi == p.shape[0]:  # every row (a GPU's one block): nothing to read
            a, b = 0, rows.shape[0]
        else:
            a, b = torch.searchsorted(rows, torch.tensor([lo, hi], device=rows.device)).tolist()
        return values.new_zeros((hi - lo,) + values.shape[1:]).index_copy_(
            0, rows[a:b] - lo, values[a:b])
    _rowopt.update_rows(kind, hp, p, rows, values, state, dense_grad)


def _columns(p: Tensor, cols: Tensor, values: Tensor, m: Tensor, v: Tensor, step: int,
             group: Dict[str, Any]) -> None:
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
            _adam(views[0], dense_g, views[1], views[2], step, group)
            for t, old in zip(views, saved):
                t.index_copy_(1, untouched, old)
        return
    chunk = max(1, _CHUNK // max(1, n_rows))
    for start in range(0, cols.shape[0], chunk):
        idx, g = cols[start:start + chunk], values[:, start:start + chunk].contiguous()
        part = [t.index_select(1, idx) for t in (p, m, v)]
        _adam(part[0], g, part[1], part[2], step, group)
        for t, new in zip((p, m, v), part):
            t.index_copy_(1, idx, new)


# -- the optimiser in the backward ---------------------------------------------------------
_DEFAULTS = {"sgd": dict(lr=1e-3, eps=0.0, weight_decay=0.0),
             "adam": dict(lr=1e-3, eps=1e-8, weight_decay=0.0),
             "adamw": dict(lr=1e-3, eps=1e-8, weight_decay=1e-2),
             "adagrad": dict(lr=1e-2, eps=1e-10, weight_decay=0.0),
             "rowwise_adagrad": dict(lr=1e-2, eps=1e-10, weight_decay=0.0)}


# LazyAdam's hyperparameters, the keys of its defaults
_LAZY_KEYS = ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "dense_above")
# what torch.optim.Optimizer.__setstate__ (run by its load_state_dict and by a copy) adds
# to an optimiser's defaults: not a hyperparameter of LazyAdam's nor of its subclasses'
_TORCH_ADDED = ("differentiable",)

# the hyperparameters an InBackwardOptimizer reads (what _in_backward_hp makes)
_HP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "nesterov",
            "initial_accumulator_value", "dense_above")
# those of each kind (its ``defaults``): what LR schedulers read, e.g. OneCycleLR
# cycles "betas" where they are present, else "momentum"
_KIND_KEYS = {"sgd": ("lr", "momentum", "nesterov", "weight_decay", "dense_above"),
              "adam": ("lr", "betas", "eps", "weight_decay", "dense_above"),
              "adamw": ("lr", "betas", "eps", "weight_decay", "dense_above"),
              "adagrad": ("lr", "eps", "weight_decay", "initial_accumulator_value", "dense_above"),
              "rowwise_adagrad": ("lr", "eps", "weight_decay", "initial_accumulator_value",
                                  "dense_above")}


def _scheduler_keys(group: Dict[str, Any]) -> Dict[str, Any]:
    """What else than the kind's hyperparameters and ``params`` a table's group holds: the
    keys an LR scheduler added (``initial_lr``, OneCycleLR's ``max_lr``...)."""
    return {k: v for k, v in group.items()
            if isinstance(k, str) and k not in _HP_KEYS and k != "params"}


# torch.optim.Optimizer's hook tables, which its register_*_hook methods fill
# (OrderedDicts: torch's RemovableHandle keeps a weak reference to them)
_HOOK_TABLES = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
                "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
                "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks")
# what __getstate__ leaves out: the hooks, and an LR scheduler's wrapper of ``step`` (an
# instance attribute calling this object: a copy would step the original), as
# torch.optim.Optimizer.__getstate__ leaves them out; and the ``state`` mapping
# (_JoinedState), which __setstate__ makes again over the copied parts
_NOT_PICKLED = _HOOK_TABLES + ("step", "_state")


def _zeroed_by(update: _rowopt.TableUpdate, grad: Tensor) -> bool:
    """Whether ``grad`` is the in-backward weight's ``.grad`` as ``zero_grad(set_to_none=
    False)`` left it: the same tensor, not written since (zero: nothing to apply)."""
    zeroed = update.zeroed
    return zeroed is not None and zeroed[0]() is grad and grad._version == zeroed[1]


# the layers an optimiser in the backward attaches to
_SparseLayer = Union["SparseLinearBatch", "SparseOutputLinear"]


def _sparse_layers(model: nn.Module) -> List[Tuple[str, _SparseLayer, Tensor, Tensor]]:
    """``(name, layer, table, parameter)`` for each nnsparse sparse layer whose weight
    is trained (``table`` is the contiguous view whose rows the batches touch)."""
    from .layers.linear import (SparseLinearBatch, _parametrized_update_message,
                                _parametrized_weight, _parametrized_weight_trains, _pruned,
                                _pruned_update_message)
    from .layers.sparse_output import SparseOutputLinear
    found: List[Tuple[str, _SparseLayer, Tensor, Tensor]] = []
    owner: Dict[int, str] = {}  # the first layer holding each parameter (model.parameters()'s identity)
    for name, module in model.named_modules():
        param: Tensor
        if (isinstance(module, (SparseLinearBatch, SparseOutputLinear))
                and _parametrized_weight(module)):
            # before the weight is read: a parametrization runs at each read
            # (spectral_norm's power iteration updates its buffers)
            if _parametrized_weight_trains(module):  # the update would write a temporary
                raise NotImplementedError(_parametrized_update_message(
                    f"model: {type(module).__name__} {name or type(module).__name__!r}"))
            continue  # frozen: left to the dense part, as a frozen weight is
        pruned = _pruned(module) if isinstance(module, (SparseLinearBatch,
                                                        SparseOutputLinear)) else None
        if pruned is not None:
            orig = module._parameters.get(pruned + "_orig")
            if orig is None or orig.requires_grad:  # the update would write a temporary
                raise NotImplementedError(_pruned_update_message(
                    f"model: {type(module).__name__} {name or type(module).__name__!r}",
                    pruned))
            continue  # frozen: left to the dense part, as a frozen weight is
        if isinstance(module, SparseLinearBatch):
            table = module._table()
            param = module.weight_t if module.sparse_grad else module.weight
        elif isinstance(module, SparseOutputLinear):
            table = param = module.weight
        else:
            continue
        if param.requires_grad:
            if not table.is_contiguous():  # the rows are updated in place
                from .layers.linear import _NOT_COLUMN_MAJOR, _NOT_ROW_MAJOR
                layout = (_NOT_ROW_MAJOR if isinstance(module, SparseOutputLinear)
                          else _NOT_COLUMN_MAJOR)
                raise ValueError(layout.format(name=name or type(module).__name__))
            name = name or type(module).__name__
            shared = owner.setdefault(id(param), name)
            if shared != name:
                # two tables updating one weight would each take a full step with its own
                # state: two Adam steps where torch.optim takes one with the summed gradient
                raise NotImplementedError(_tied(f"layers {shared!r} and {name!r} share their "
                                                f"weight", "each layer would take its own "
                                                "step with its own state"))
            found.append((name, module, table, param))
    _refuse_tied_elsewhere(model, found)
    return found


def _holds_sparse_layer(model: nn.Module) -> bool:
    """Whether ``model`` holds a ``SparseLinearBatch`` or ``SparseOutputLinear``, trained or not."""
    from .layers.linear import SparseLinearBatch
    from .layers.sparse_output import SparseOutputLinear
    return any(isinstance(m, (SparseLinearBatch, SparseOutputLinear)) for m in model.modules())


def _refuse_tied_elsewhere(model: nn.Module, found: List[Tuple[str, Any, Tensor, Tensor]]
                           ) -> None:
    """A sparse layer's weight held by another module too (an ``nn.Linear`` tied to it):
    that module's gradient would accumulate in ``.grad``, never applied."""
    tables = {id(param): name for name, _, _, param in found}
    layers = {id(module) for _, module, _, _ in found}
    for name, module in model.named_modules():
        if id(module) in layers:
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in tables:
                where = f"{name}.{pname}" if name else pname
                raise NotImplementedError(_tied(
                    f"{where!r} is the weight of layer {tables[id(p)]!r}",
                    f"the gradient {where!r} gives it would never be applied"))


def _tied(what: str, why: str) -> str:
    return (f"model: {what} (tied weights), which the optimiser in the backward cannot "
            f"update: {why}; train tied weights with materialised gradients (torch.optim, "
            f"nnsparse.optim.LazyAdam or nnsparse.make_optimizer)")


def _gets_sparse_grads(model: nn.Module, layers: List[Tuple[str, Any, Tensor, Tensor]],
                       params: List[Tensor]) -> bool:
    """Whether one of ``params`` gets sparse COO gradients: a parameter of a
    ``sparse_grad=True`` layer that is not in the backward (its weight frozen: its bias
    then gets them) or of an ``nn.Embedding(sparse=True)``."""
    from ._optim_split import _gives_sparse_grad
    attached = {id(layer) for _, layer, _, _ in layers}
    sparse = {id(p) for m in model.modules() if id(m) not in attached and _gives_sparse_grad(m)
              for p in m.parameters(recurse=False)}
    return any(id(p) in sparse for p in params)


def _dense_optimizer(kind: str, params: List[Tensor], hp: Dict[str, Any],
                     sparse: bool = False) -> Optional[Optimizer]:
    """torch.optim's counterpart of ``kind`` for the other parameters, fused where it can be.

    ``sparse``: some of them get sparse gradients (the bias of a ``sparse_grad=True``
    layer whose weight is frozen, so not in the backward): torch's unfused SGD and
    Adagrad take those, and :class:`LazyAdam` replaces Adam/AdamW (which refuse them;
    LazyAdam is Adam on the dense ones)."""
    if not params:
        return None
    if sparse and kind not in ("adam", "adamw") and hp["weight_decay"]:
        # torch's SGD and Adagrad accept sparse gradients only without decay, and
        # would raise at the first step()
        raise ValueError(f"weight_decay must be 0 for kind {kind!r} when a parameter outside "
                         f"the backward gets sparse gradients (the bias of a sparse_grad=True "
                         f"layer whose weight is frozen, an nn.Embedding(sparse=True)), got "
                         f"{hp['weight_decay']}: torch.optim's {kind.split('_')[-1]} cannot "
                         f"decay them; use 'adam'/'adamw', or sparse_grad=False")
    if sparse and kind in ("adam", "adamw"):
        return LazyAdam(params, lr=hp["lr"], betas=hp["betas"], eps=hp["eps"],
                        weight_decay=hp["weight_decay"], decoupled_weight_decay=kind == "adamw")
    fused = True if not sparse and all(_rowopt.fused_ok(p) for p in params) else None
    common = dict(lr=hp["lr"], weight_decay=hp["weight_decay"], fused=fused)
    if kind == "sgd":
        return torch.optim.SGD(params, momentum=hp["momentum"], nesterov=hp["nesterov"],
                               **common)
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(params, betas=hp["betas"], eps=hp["eps"], **common)
    return torch.optim.Adagrad(params, eps=hp["eps"],
                               initial_accumulator_value=hp["initial_accumulator_value"],
                               **common)


class InBackwardOptimizer(Optimizer):
    r"""The optimiser applied inside the backward of nnsparse's sparse layers, plus
    ``torch.optim`` for every other parameter.  Built by :func:`apply_optimizer_in_backward`.

    As FBGEMM's table-batched embeddings (TorchRec) do, the weight of every
    :class:`~nnsparse.SparseLinearBatch` and :class:`~nnsparse.SparseOutputLinear`
    of the model is updated *during* ``loss.backward()``: each touched row's
    gradient is computed and the row and its optimiser state are updated at
    once (one gather of the touched rows, one fused optimiser pass, one
    scatter; above a share of touched rows the dense step, made block by
    block).  These weights get no ``.grad`` (:meth:`zero_grad` clears one left from
    before, as torch's does).  On a GPU
    the step makes no host synchronisation: every row's gradient is made at
    once, the dense step runs over the table and the untouched rows are put
    back from a copy (a gradient and a copy of the table and its state, per
    layer and step, are the memory this costs there).  The other parameters (biases, other
    modules) are trained by :attr:`dense`, torch's own optimiser of the same
    kind (``fused=True`` where torch has the kernel), through :meth:`step`
    and :meth:`zero_grad` as usual.

    Semantics, for the in-backward weights:

    * **One step per forward.**  The backward of each forward is an optimiser
      step.  A second backward of the same graph, several forwards before one
      backward (the losses of several batches summed) or a layer called twice
      before one backward are refused with a ``RuntimeError`` (use a larger
      batch, or materialised gradients with :class:`LazyAdam` / ``torch.optim``).
      A layer used twice in the graph a backward runs (``crit(dec(h1, x1), x1) +
      crit(dec(h2, x2), x2)``, an encoder applied to two batches) is refused before
      any layer of this optimiser steps: each layer about to step asks torch's
      engine (as below) whether two of a table's forwards since its last step will
      run in this backward, naming the layer; call it once on the concatenated
      batches.  A forward this backward does not reach (an evaluation outside
      ``torch.no_grad()`` whose output is kept, a batch for a later backward) is
      not counted.  A torch without the engine's answer refuses at the second
      use's backward, after the first use stepped.  Under
      ``torch.utils.checkpoint(use_reentrant=True)`` (its backward runs nested) a
      layer used twice outside the checkpoint is refused when the checkpointed
      layers are recomputed, before they step; one used twice inside checkpoints
      (two of them, or both uses in one) is refused too, but after the layers whose
      backward ran before (``use_reentrant=False``: before any).
      So is gradient accumulation by a forward and a backward per batch, then one
      :meth:`step`: where there is a :attr:`dense` part, a second backward before
      :meth:`step` or :meth:`zero_grad` raises ``RuntimeError`` (each backward would
      step these weights with its own batch's gradient while :attr:`dense` summed the
      batches' gradients and stepped once: not an accumulated step).  Without a dense
      part (every parameter in the backward) each backward is simply a step.  The
      refusal comes from the backward of the layer concerned: the layers whose
      backward ran before it in that pass (those nearer the loss) have taken
      their step, the others have not.  (Refusing at the second forward instead
      would also refuse a harmless forward whose output is kept and never
      differentiated, e.g. an evaluation outside ``torch.no_grad()``.)
    * **Lazy.**  Only touched rows (input columns of a ``SparseLinearBatch``,
      output columns of a ``SparseOutputLinear``'s pattern) and their state
      change.  Weight decay is *plainly lazy*: applied, as the torch
      optimiser of the same kind applies it, to the touched rows at the steps
      they are touched (an untouched row is not decayed, and there is no
      catch-up later).  ``adamw`` decays decoupled, the others add ``weight_decay * p``
      to the gradient.  Adam's bias correction uses the table's step count
      (one per backward), as FBGEMM does.  With every row touched at every
      step, each kind equals its torch optimiser (``sgd``: ``torch.optim.SGD``
      without dampening; ``adagrad``: ``torch.optim.Adagrad`` without
      ``lr_decay``) within float tolerance.
    * **Dense above a share** (``dense_above``, off by default here, 0.1 in
      :func:`fused_step_optimizer`): a step touching more than that share of
      a table's rows is the torch optimiser's dense step on the whole table
      (untouched rows get a zero gradient: their moments decay, Adam moves
      them, weight decay shrinks them), made block by block from the
      backward's gradient rows; it costs less than gathering most rows.
      For the kinds a zero gradient leaves unchanged (``sgd`` without
      momentum, ``adagrad``, ``rowwise_adagrad``, all without weight decay)
      the dense step *is* the lazy one: it is taken above 25 % of touched
      rows whatever ``dense_above`` says (a larger share is lowered to it),
      with the lazy step's result.
    * **Row-wise Adagrad** (``"rowwise_adagrad"``): one accumulator per row,
      ``acc[r] += mean(g[r]**2)``, ``p[r] -= lr * g[r] / (sqrt(acc[r]) + eps)``:
      FBGEMM's ``EXACT_ROWWISE_ADAGRAD``, the usual choice for large tables
      (state of one value per row instead of one per weight).
    * **Only a backward that accumulates into the weight steps it**:
      ``loss.backward()``, ``loss.backward(inputs=[..., weight])``.
      ``torch.autograd.grad`` of other tensors (a gradient norm for logging,
      the input's or a bias's gradient) and ``backward(inputs=[...])`` without
      the weight change neither the weight nor its state or step count, and
      make none of its gradient rows; the next ordinary step is as if the call
      had not been made.  ``torch.autograd.grad(loss, weight)`` returns the
      weight's gradient, dense in the parameter's shape and layout, and steps
      nothing.  Each layer asks torch's engine, on the host, through
      ``torch._C._will_engine_execute_node`` (private; torch's public
      ``register_multi_grad_hook`` uses it); a torch without it steps in
      every backward.
    * **Recorded backwards** (``create_graph=True``: gradient penalties,
      Hessian-vector products).  ``torch.autograd.grad(..., create_graph=True)``
      of a layer's own bias or weight, or of parameters nearer the loss, works
      (a backward of the penalised loss then steps each layer with the whole
      gradient).  One that would step a weight (``loss.backward(create_graph=True)``),
      or asks for anything before an attached layer (its recorded gradient
      reads that layer's weight, and a backward through it would give the
      weight a ``.grad`` nothing applies), raises ``RuntimeError`` naming the
      layer, before anything is updated.  ``remove()`` this optimiser and use
      ``torch.optim`` or :class:`LazyAdam` there (``docs/ecosystem.md``).
    * A dense (strided) input to a ``SparseLinearBatch``, or no pattern for a
      ``SparseOutputLinear`` (the dense output), specifies every entry: the
      backward steps every row of the weight from its dense gradient (none
      for an input of no rows), the step a sparse batch or pattern holding
      every entry explicitly gives, with the same checks.
    * Not combinable with ``DistributedDataParallel`` (the in-backward rows
      are updated from each process's local gradient, never all-reduced):
      refused for a DDP-wrapped model, and (``NotImplementedError``) at a layer's
      training forward run by a DDP wrapper (the optimiser attached to
      ``ddp.module``, or before wrapping in torch's DDP).  Parameters DDP is told
      to ignore, and a model outside the wrapped module run in its forward, are
      the user's to keep in step: not refused.  A forward of
      ``ddp.module`` itself, outside DDP, is not detected.
    * **Learning-rate schedulers** (``torch.optim.lr_scheduler``, ``SWALR``) work:
      it is a ``torch.optim.Optimizer`` whose :attr:`param_groups` are one group per
      in-backward layer (model order; the dict the layer's backward reads its
      ``lr``, ``betas``, ``momentum`` from), then :attr:`dense`'s groups.  A
      scheduler built fresh before this optimiser's :meth:`load_state_dict`, then
      given its own ``load_state_dict``, resumes (torch's order: built after, it
      sets its first rate again), and so does one built with ``last_epoch`` after
      the optimiser's
      :meth:`load_state_dict` (its :meth:`state_dict` keeps the layers' ``lr``
      and what a scheduler added to their groups, ``initial_lr``...).
      :meth:`set_lr` sets every group.
    * **Not with** ``torch.amp.GradScaler``: the rows are updated inside the
      backward from the *scaled* gradient, before a scaler could unscale it or
      skip a step holding inf/NaN.  ``scaler.step(optimizer)`` raises
      ``NotImplementedError``; use bfloat16 autocast without a scaler, or
      :class:`LazyAdam` / ``torch.optim`` with the scaler.
    * A parametrized weight (``torch.nn.utils.parametrize``: ``weight_norm``,
      ``spectral_norm``, ``register_parametrization``) that requires grad is refused
      (``NotImplementedError`` here; ``RuntimeError`` from the training forward of a
      layer parametrized after this optimiser was attached): the update would write
      the parametrization's output, and its original tensors would never be trained.
    * Tied weights (a sparse layer's weight shared with another sparse layer or
      any other module) are refused with a ``NotImplementedError``: each layer
      would take its own step with its own state, another module's gradient
      would never be applied.  ``LazyAdam`` and ``torch.optim`` train them.  Tied
      after attaching to a module other than a sparse layer (``linear.weight =
      layer.weight``), the weight gets a ``.grad`` from that module's backward, which
      nothing applies: :meth:`step` raises ``RuntimeError`` naming the layer before
      stepping anything, as it does for a ``.grad`` written to such a weight by hand.
    * A layer's training forward must read, as its weight, the Parameter its
      table was built on (checked by identity, O(1)): one reading another
      tensor raises ``RuntimeError`` before anything moves: a weight tied after
      attaching (``dec.weight = enc.weight_t``), another Parameter assigned
      (``load_state_dict(assign=True)``: build the optimiser after, or copy the
      values in), a tensor that requires grad given to
      ``torch.func.functional_call`` (a slice of one flat parameter vector too;
      the model's own parameters work, and a
      tensor that requires none: the layer's weight then gets no step), or a
      pruned weight (``torch.nn.utils.prune``: the layer reads ``weight_orig *
      weight_mask``, a temporary).  A layer pruned
      before attaching is refused by :func:`apply_optimizer_in_backward`
      (``NotImplementedError``; a frozen one is left to the dense part).  The
      Parameter must also keep the layout the layer made (``weight.t()``
      contiguous): one whose ``.data`` was replaced row-major (``prune.remove``
      leaves it so) raises ``RuntimeError`` at a training forward that would step
      it, naming the way round (``weight.data = weight.t().contiguous().t()``);
      frozen or under ``torch.no_grad()`` it is read as it is.  A
      ``SparseOutputLinear``'s weight must stay contiguous (its rows are the
      table; ``weight.data = weight.contiguous()`` restores it).
    * A sparse layer whose weight has ``requires_grad=False`` is left alone
      (no state, nothing in its backward); its trainable bias, if any, goes
      to :attr:`dense`.  With every sparse weight frozen, :attr:`dense`
      trains the whole model and the tables are empty.  Where such a bias
      gets sparse gradients (``sparse_grad=True``), :attr:`dense` is
      torch's unfused optimiser (SGD, Adagrad) or, for Adam and AdamW, which
      refuse sparse gradients, :class:`LazyAdam` (SGD and Adagrad with
      ``weight_decay`` are then refused: torch's cannot decay sparse
      gradients).  As with the parameter list of a ``torch.optim`` optimiser,
      what is trained is fixed when the optimiser is built: :meth:`step`
      raises once a parameter frozen then requires grad.
    * A copy of the model (``copy.deepcopy``, ``torch.save``) is a model alone,
      as for ``torch.optim``: its layers carry no optimiser.  An optimiser copied
      or pickled together with its model is attached to the copy's layers.

    State: :meth:`state_dict` / :meth:`load_state_dict` hold the tables'
    state (by layer name) and :attr:`dense`'s, as ``torch.optim`` does; the
    model's own ``state_dict`` is unchanged (it still loads into
    ``nn.Linear``).  :attr:`state` is ``torch.optim``'s per-parameter mapping
    (an in-backward weight's entry: its table's state, the tensors its backward
    updates).  Move or convert the model before building the optimiser.

    Example::

        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3), torch.nn.Linear(3, 2))
        >>> opt = nnsparse.optim.apply_optimizer_in_backward(model, "rowwise_adagrad", lr=0.1)
        >>> list(opt.tables), type(opt.dense).__name__   # layer 0's weight; the rest
        (['0'], 'Adagrad')
        >>> opt.set_lr(0.05)
        >>> [group["lr"] for group in opt.param_groups]     # layer 0's, then dense's
        [0.05, 0.05]
        >>> opt.remove()   # layer 0 back to ordinary gradients

    Attributes:
        dense (torch.optim.Optimizer or None): the optimiser of the other parameters.
        kind (str): ``"sgd"``, ``"adam"``, ``"adamw"``, ``"adagrad"`` or ``"rowwise_adagrad"``.
        defaults (dict): the kind's hyperparameters as given (``lr``, and ``betas``,
            ``momentum`` ... as the kind has them).
    """

    # GradScaler.step hands such an optimiser its scale (grad_scale, found_inf)
    # instead of unscaling: step() refuses it (the rows were stepped in the backward)
    _step_supports_amp_scaling = True

    def __init__(self, model: nn.Module, kind: str, hp: Dict[str, Any]) -> None:
        as_choice(kind, "kind", _rowopt.KINDS,
                  then="; build it with apply_optimizer_in_backward(model, kind, ...)")
        if not isinstance(hp, dict):
            raise TypeError(f"hp must be a dict of hyperparameters, got {type(hp).__name__}")
        # built by hand, not by apply_optimizer_in_backward: torch's KeyError or message
        missing = [key for key in _HP_KEYS if key not in hp]
        if missing:
            raise ValueError(f"hp must hold {list(_HP_KEYS)}, got no {missing}; build the "
                             f"optimiser with apply_optimizer_in_backward(model, kind, ...)")
        _check_hyper(kind, hp)
        _check_share(hp["dense_above"])
        hp = _numbers(hp)
        layers = _sparse_layers(model)
        for name, layer, _, _ in layers:
            if layer._row_update is not None:
                raise ValueError(f"model: layer {name!r} already has an optimiser in the "
                                 f"backward; call remove() on the old one first")
        self.kind, self._hp = kind, hp
        self._layers = [(name, layer) for name, layer, _, _ in layers]
        self._updates: Dict[str, _rowopt.TableUpdate] = {}
        for name, layer, table, param in layers:
            self._updates[name] = _rowopt.TableUpdate(
                kind, hp, table, f"{type(layer).__name__} {name!r}", param)
            # the table's hyperparameters are its param group (what schedulers edit)
            self._updates[name].hp["params"] = [param]
        fused_ids = {id(param) for _, _, _, param in layers}
        rest: List[Tensor] = [p for p in model.parameters()
                              if p.requires_grad and id(p) not in fused_ids]
        if not layers and not rest:  # torch.optim's "optimizer got an empty parameter list"
            count = sum(1 for _ in model.parameters())
            held = f"its {count} parameters are all frozen" if count else "it has none"
            raise ValueError(f"model must have parameters that require grad, got none "
                             f"({held}): the optimiser would train nothing")
        self.dense = _dense_optimizer(kind, rest, hp, _gets_sparse_grads(model, layers, rest))
        # frozen now, so trained by neither part: step() refuses once one is unfrozen
        self._frozen = [(name, p) for name, p in model.named_parameters() if not p.requires_grad]
        # No Optimizer.__init__: the tables and dense own the parameters and their state.
        self.defaults: Dict[str, Any] = {k: hp[k] for k in _KIND_KEYS[kind]}
        self._init_hooks()
        self._join_state()
        if self.dense is not None:  # it accumulates: a second backward before step() is refused
            for u in self._updates.values():
                u.pending = 0
        self._link_tables()
        for name, layer in self._layers:  # attach last: nothing is changed on a failure above
            layer._row_update = self._updates[name]

    def _init_hooks(self) -> None:
        for name in _HOOK_TABLES:
            if name not in self.__dict__:
                setattr(self, name, OrderedDict())

    def _join_state(self) -> None:
        # each table's state dict (the one its backward updates) under its parameter
        self._state = _JoinedState({u.hp["params"][0]: u.state for u in self._updates.values()},
                                   {"dense": self.dense} if self.dense is not None else {})

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        """One group per in-backward layer (its ``lr`` and kind's settings, read by
        its backward at each step), then :attr:`dense`'s groups."""
        groups = [u.hp for u in self._updates.values()]
        return groups + (self.dense.param_groups if self.dense is not None else [])

    @property
    def state(self) -> "_JoinedState":  # type: ignore[override]
        """Per-parameter state, as ``torch.optim.Optimizer.state``: one mapping for the
        optimiser's life, parameter -> state dict, the same dict at each access.  An
        in-backward weight's is its table's state (:attr:`tables`): ``step`` and the
        kind's tensors, the very ones its backward updates (in the table's layout: a
        dense-gradient ``SparseLinearBatch``'s moments are ``(in_features,
        out_features)``, its weight transposed; ``rowwise_adagrad``'s ``sum`` one value
        per row); another parameter's is :attr:`dense`'s ``state[p]``.  Keys written
        into an entry stay there and are saved by :meth:`state_dict`; a table's are
        loaded back by :meth:`load_state_dict`, while a :attr:`dense` entry holding a
        key its optimiser does not keep is refused there (``ValueError``, as the state
        of another optimiser: delete the key before saving).  Replacing or
        deleting a table's entry (``opt.state[weight] = {...}``) raises
        ``NotImplementedError``: change its tensors in place, or :meth:`load_state_dict`."""
        return self._state

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise NotImplementedError("an InBackwardOptimizer trains what it was built with; add "
                                  "the group to its dense part: optimizer.dense.add_param_group"
                                  "(...)")

    def __getstate__(self) -> Dict[str, Any]:
        # the layers it is still attached to (not after remove(), nor where another
        # optimiser took its place), for __setstate__; not the hooks (callables)
        state = {k: v for k, v in self.__dict__.items() if k not in _NOT_PICKLED}
        state["_attached"] = [name for name, layer in self._layers
                              if layer._row_update is self._updates[name]]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # a pickled or deep-copied layer drops its optimiser in the backward (see
        # SparseLinearBatch.__getstate__): the optimiser copied with it attaches again,
        # to the layers the original was attached to when copied
        state = dict(state)
        attached = set(state.pop("_attached", [name for name, _ in state["_layers"]]))
        self.__dict__.update(state)
        self._init_hooks()
        self._join_state()
        self._link_tables()  # (tables pickled before they knew one another too)
        for name, layer in self._layers:
            if name in attached:
                layer._row_update = self._updates[name]

    def __repr__(self) -> str:
        dense = type(self.dense).__name__ if self.dense is not None else None
        return (f"InBackwardOptimizer(kind={self.kind!r}, in_backward={list(self._updates)}, "
                f"dense={dense})")

    @property
    def tables(self) -> Dict[str, Dict[str, Tensor]]:
        """Each in-backward layer's optimiser state (``step`` and the kind's tensors), by name."""
        return {name: u.state for name, u in self._updates.items()}

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    # torch's wrapper (Optimizer.__init__ puts it on a subclass's step; no __init__ here):
    # the step hooks, torch.optim.optimizer's global ones too, with torch's arguments
    @Optimizer.profile_hook_step
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """Step :attr:`dense` (the in-backward weights were updated by the backward).
        The hooks of ``register_step_pre_hook`` / ``_post_hook`` run around it, and the
        global ones of ``torch.optim.optimizer`` once (not again for :attr:`dense`,
        whose own hooks run around its step), as around a torch optimiser's step.

        Raises:
            RuntimeError: a parameter frozen when the optimiser was built now
                requires grad (neither part would ever train it: build the
                optimiser again after unfreezing), or an in-backward weight has a
                ``.grad`` (nothing would apply it: a module outside the in-backward
                tables shares the weight, e.g. one tied to it after attaching, or the
                gradient was written by hand, or left from before attaching and not
                cleared by :meth:`zero_grad`), other than the zero one
                ``zero_grad(set_to_none=False)`` left, unchanged.  Nothing is stepped.
            NotImplementedError: called by ``torch.amp.GradScaler.step``.
        """
        if "found_inf" in self.__dict__:  # set by GradScaler.step just before this call
            self.__dict__.pop("found_inf")
            self.__dict__.pop("grad_scale", None)
            raise NotImplementedError(
                "torch.amp.GradScaler cannot drive an InBackwardOptimizer: its layers' rows "
                "were updated inside backward() from the scaled gradient, before the scaler "
                "could unscale it or skip a step holding inf/NaN; use bfloat16 autocast "
                "without a scaler, or nnsparse.optim.LazyAdam / torch.optim with the scaler")
        _check_closure(closure)
        thawed = [name for name, p in getattr(self, "_frozen", ()) if p.requires_grad]
        if thawed:
            raise RuntimeError(f"parameters {thawed} were frozen when this optimiser was built "
                               f"and now require grad: it would never train them; build the "
                               f"optimiser again after unfreezing")
        self._refuse_table_grads()
        # the global hooks ran once around this step, with this optimiser: not again for dense
        try:
            return (_step_part(self.dense, closure) if self.dense is not None
                    else _closure_loss(closure))
        finally:
            self._end_accumulation()

    def _refuse_table_grads(self) -> None:
        """Refuse a ``.grad`` on an attached in-backward weight: nothing would apply it (its
        rows are stepped inside the backward, which gives it none; :attr:`dense` does not own
        it).  A few attribute reads per table."""
        for name, layer in self._layers:
            u = self._updates[name]
            param = u.param
            # (a weight of no entries, a layer of width 0, gets an empty gradient from the
            # layer's (rows, 0) product: nothing left unapplied)
            if (param is None or param.grad is None or layer._row_update is not u
                    or param.numel() == 0 or _zeroed_by(u, param.grad)):
                continue
            raise RuntimeError(
                f"the weight of {u.name} has a .grad, which nothing applies: the optimiser in the "
                f"backward updates its rows inside loss.backward() and gives it no .grad, and "
                f"the dense part does not train it.  Likely the weight is shared with a module "
                f"outside the in-backward tables (e.g. an nn.Linear whose weight was tied to "
                f"it after this optimiser was attached), or a gradient was written to it by "
                f"hand (or left from before attaching).  Untie it (give the other module its "
                f"own Parameter), or remove() this optimiser and train the model with "
                f"nnsparse.optim.LazyAdam or torch.optim; a gradient written by hand or left "
                f"from before attaching: this optimiser's zero_grad() clears it (call it "
                f"before the backward), or set weight.grad = None.  Nothing was stepped")

    def _link_tables(self) -> None:
        """Give every table of this optimiser the list of them all (``TableUpdate.group``):
        a backward about to step one checks them all for a layer used twice."""
        group = list(self._updates.values())
        for u in group:
            u.group = group

    def _end_accumulation(self) -> None:
        """A backward may step the tables again (see ``TableUpdate.pending``)."""
        for u in self._updates.values():
            if u.pending is not None:
                u.pending = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of every parameter of :attr:`param_groups`, as
        ``torch.optim.Optimizer.zero_grad`` does: :attr:`dense`'s, and the in-backward
        weights'.

        The backward gives an in-backward weight no ``.grad``, but one may be there from
        before this optimiser was attached (or written by hand), which :meth:`step`
        refuses as a gradient nothing applies.  With ``set_to_none=True`` (the default)
        it is set to ``None``; with ``set_to_none=False`` it is detached and zeroed in
        place, as torch zeroes the ``.grad`` of a parameter it owns, and :meth:`step`
        takes that zero ``.grad`` as long as it is the same tensor, unchanged since (its
        ``_version``: a backward that adds to it, a weight tied to another module, is
        refused again).  A ``.grad`` that appears between ``zero_grad()`` and
        :meth:`step` is refused there.

        Args:
            set_to_none (bool): set the gradients to ``None`` rather than zero them.
                Default: ``True``.
        """
        set_to_none = as_flag(set_to_none, "set_to_none")
        for u in self._updates.values():
            param = u.param
            if param is None or param.grad is None:
                continue
            if set_to_none:
                param.grad = None
                continue
            grad = param.grad
            if grad.grad_fn is not None:  # torch.optim.Optimizer.zero_grad's steps
                grad.detach_()
            else:
                grad.requires_grad_(False)
            grad.zero_()
            u.zeroed = (weakref.ref(grad), grad._version)
        if self.dense is not None:
            self.dense.zero_grad(set_to_none)
        self._end_accumulation()

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every group: the in-backward weights' and :attr:`dense`'s.

        A one-element tensor is read once here, as a float (as the hyperparameters given
        to :func:`apply_optimizer_in_backward` are)."""
        _check_non_negative("lr", lr)
        lr = _number(lr)
        for u in self._updates.values():
            u.hp["lr"] = lr
        if self.dense is not None:
            for group in self.dense.param_groups:
                group["lr"] = lr

    def remove(self) -> None:
        """Detach from the layers: their weights get gradients again."""
        for name, layer in self._layers:
            if layer._row_update is self._updates[name]:
                layer._row_update = None

    def state_dict(self) -> Dict[str, Any]:
        """``{"kind", "tables": {layer name: state}, "lr": {layer name: lr},
        "groups": {layer name: {key: value}}, "dense": dense.state_dict() or None}``
        (``lr``: the tables' learning rates, as :meth:`set_lr` or a scheduler left
        them; ``groups``: what else a scheduler put in a table's group, such as
        ``initial_lr``, which a scheduler built with ``last_epoch`` reads), through
        the hooks of ``register_state_dict_pre_hook`` / ``_post_hook`` as torch's
        optimisers call them."""
        return _state_dict_with_hooks(self, self._own_state_dict)

    def _own_state_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind,
                "tables": {n: {k: t for k, t in u.state.items()} for n, u in self._updates.items()},
                "lr": {n: u.hp["lr"] for n, u in self._updates.items()},
                "groups": {n: _scheduler_keys(u.hp) for n, u in self._updates.items()},
                "dense": self.dense.state_dict() if self.dense is not None else None}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a :meth:`state_dict`; everything is checked before anything is changed.
        The ``register_load_state_dict_pre_hook`` / ``_post_hook`` hooks run around it.
        A table's state is cast to its weight's dtype and device, as torch's optimisers
        cast theirs: after a conversion that kept the parameters
        (``torch.__future__.set_swap_module_params_on_conversion(True)``, then
        ``model.double()``), ``optimizer.load_state_dict(optimizer.state_dict())``
        converts the state."""
        _load_with_hooks(self, state_dict, self._load_own)

    def _load_own(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict (from state_dict()), "
                            f"got {type(state_dict).__name__}")
        if state_dict.get("kind") != self.kind:
            raise ValueError(f"state_dict must be of {_a(repr(self.kind))} optimiser, "
                             f"got {state_dict.get('kind')!r}")
        tables = state_dict.get("tables", {})
        if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
            raise TypeError("state_dict['tables'] must be a dict of layer name -> dict of tensors")
        if set(tables) != set(self._updates):
            raise ValueError(f"state_dict must hold the layers {sorted(self._updates)}, "
                             f"got {sorted(tables)}")
        for name, u in self._updates.items():
            for key in _rowopt.state_names(self.kind):
                t = u.state[key]
                if key not in tables[name]:  # incomplete, as a missing layer: a ValueError
                    raise ValueError(f"state_dict['tables'][{name!r}][{key!r}] must be a tensor "
                                     f"of shape {tuple(t.shape)}, got no such entry")
                given = tables[name][key]
                if not isinstance(given, Tensor):
                    raise TypeError(f"state_dict['tables'][{name!r}][{key!r}] must be a tensor "
                                    f"of shape {tuple(t.shape)}, got {given!r}")
                if given.shape != t.shape:
                    raise ValueError(f"state_dict['tables'][{name!r}][{key!r}] must be a tensor "
                                     f"of shape {tuple(t.shape)}, got {tuple(given.shape)}")
                if key == "step":
                    _check_step(given, f"state_dict['tables'][{name!r}]['step']")
                else:
                    _check_state_tensor(given, f"state_dict['tables'][{name!r}][{key!r}]")
                    if key in _SQUARES:
                        _check_squares(given, f"state_dict['tables'][{name!r}][{key!r}]")
        # what else an entry holds (keys a user wrote into opt.state[p]) is the loaded
        # entry's, as torch's load replaces an entry: its tensors checked as the dense
        # part's are, and cast as torch casts them (below, before anything is loaded)
        names = _rowopt.state_names(self.kind)
        for name in self._updates:
            for key, value in tables[name].items():
                if key not in names and isinstance(value, Tensor):
                    _check_state_tensor(value, f"state_dict['tables'][{name!r}][{key!r}]")
        if (state_dict.get("dense") is None) != (self.dense is None):
            raise ValueError("state_dict['dense'] must be given exactly when the model has "
                             "parameters outside the in-backward layers")
        if self.dense is not None:
            _check_state_entries(state_dict["dense"], self.dense, "state_dict['dense']",
                                 _state_keys(self.dense))
            _check_torch_groups(state_dict["dense"], self.dense, "state_dict['dense']")
        rates = state_dict.get("lr", {})  # absent from older state dicts: the rates are kept
        if not isinstance(rates, dict):
            raise TypeError(f"state_dict['lr'] must be a dict of layer name -> learning rate "
                            f"for the layers {sorted(self._updates)}, got {rates!r}")
        if not set(rates) <= set(self._updates):
            raise ValueError(f"state_dict['lr'] must be a dict of layer name -> learning rate "
                             f"for the layers {sorted(self._updates)}, got {rates!r}")
        for name, lr in rates.items():
            _check_non_negative(f"state_dict['lr'][{name!r}]", lr)
        rates = {name: _number(lr) for name, lr in rates.items()}
        groups = state_dict.get("groups", {})  # absent from older state dicts
        expected = (f"state_dict['groups'] must be a dict of layer name -> dict of the keys a "
                    f"scheduler added (not {list(_HP_KEYS)} nor 'params') for the layers "
                    f"{sorted(self._updates)}, got {groups!r}")
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise TypeError(expected)
        if not set(groups) <= set(self._updates) or any(g != _scheduler_keys(g)
                                                         for g in groups.values()):
            raise ValueError(expected)
        # to the weight's device and dtype (made before the first change)
        extras = {name: {key: _cast_as_torch(value, u.hp["params"][0])
                         for key, value in tables[name].items() if key not in names}
                  for name, u in self._updates.items()}
        # a state tensor in another dtype or on another device than its weight (the
        # weight converted in place, torch.__future__.set_swap_module_params_on_conversion)
        # is replaced by the loaded one cast to the weight's, as torch's load casts state
        # (``step`` keeps its float32, moved to the weight's device only)
        moved: Dict[str, Dict[str, Tensor]] = {}
        for name, u in self._updates.items():
            param = u.hp["params"][0]
            moved[name] = {}
            for key in names:
                dtype = u.state[key].dtype if key == "step" else param.dtype
                if u.state[key].dtype != dtype or u.state[key].device != param.device:
                    moved[name][key] = tables[name][key].to(
                        dtype=dtype, device=param.device, memory_format=torch.contiguous_format,
                        copy=True)
        if self.dense is not None:
            self.dense.load_state_dict(state_dict["dense"])
        for name, u in self._updates.items():
            for key in names:  # into the tensors the backward updates
                if key in moved[name]:
                    u.state[key] = moved[name][key]
                else:
                    u.state[key].copy_(tables[name][key])
            for key in [k for k in u.state if k not in names]:
                del u.state[key]
            u.state.update(extras[name])
            u.hp["lr"] = rates.get(name, u.hp["lr"])
            u.hp.update(groups.get(name, {}))


def _cast_as_torch(value: Any, param: Tensor) -> Any:
    """A loaded state value (not ``step``) as ``torch.optim.Optimizer.load_state_dict``
    casts it: a tensor to ``param``'s device, and to its dtype if ``param`` is floating;
    anything else as it came."""
    if not isinstance(value, Tensor):
        return value
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device)
    return value.to(device=param.device)


def _state_dict_with_hooks(opt: Optimizer, make: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """``make()``, the state dict of an optimiser that keeps its own, between the hooks
    of ``register_state_dict_pre_hook`` / ``_post_hook``, as ``torch.optim`` calls them."""
    for pre in list(opt._optimizer_state_dict_pre_hooks.values()):
        pre(opt)
    state = make()
    for post in list(opt._optimizer_state_dict_post_hooks.values()):
        result = post(opt, state)
        state = state if result is None else result
    return state


def _load_with_hooks(opt: Optimizer, state_dict: Dict[str, Any],
                     load: Callable[[Dict[str, Any]], None]) -> None:
    """``load(state_dict)`` between the hooks of ``register_load_state_dict_pre_hook`` /
    ``_post_hook``, as ``torch.optim`` calls them (a pre-hook may replace the dict)."""
    for pre in list(opt._optimizer_load_state_dict_pre_hooks.values()):
        result = pre(opt, state_dict)
        state_dict = state_dict if result is None else result
    load(state_dict)
    for post in list(opt._optimizer_load_state_dict_post_hooks.values()):
        post(opt)


def _step_part(part: Optimizer, closure: Optional[Callable[[], float]] = None) -> Any:
    """``part.step(closure)``, ``part`` being a part of an optimiser made of several
    (:attr:`InBackwardOptimizer.dense`, a ``SplitOptimizer``'s parts), as torch's wrapper
    of ``step`` (``Optimizer.profile_hook_step``) runs it: under its profiler name,
    between ``part``'s own step hooks, but without the global hooks of
    ``torch.optim.optimizer``, which ran once around the step of the optimiser holding
    ``part``, with that optimiser as their argument (as for one torch optimiser's step)."""
    step = type(part).step
    raw = getattr(step, "__wrapped__", None) if getattr(step, "hooked", False) else None
    own = part.__dict__.get("step")  # an instance's step: an LR scheduler's wrapper of it
    scheduled = getattr(own, "_wrapped_by_lr_sched", False)
    if raw is None or (own is not None and not scheduled):
        return part.step(closure)  # not torch's wrapper, or wrapped by another: called as is
    if scheduled:
        setattr(part, "_opt_called", True)  # what the scheduler's wrapper records
    args: Tuple[Any, ...] = (part,) if closure is None else (part, closure)
    kwargs: Dict[str, Any] = {}
    with torch.autograd.profiler.record_function(f"Optimizer.step#{type(part).__name__}.step"):
        for pre in list(part._optimizer_step_pre_hooks.values()):
            result = pre(part, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"{raw} must return None or a tuple of (new_args, "
                                       f"new_kwargs), but got {result}.")  # torch's message
                args, kwargs = result
        out = raw(*args, **kwargs)
        part._optimizer_step_code()
        for post in list(part._optimizer_step_post_hooks.values()):
            post(part, args, kwargs)
    return out


class _JoinedState(MutableMapping[Any, Dict[str, Any]]):
    """``opt.state`` of an optimiser made of parts (:class:`InBackwardOptimizer`,
    ``SplitOptimizer``), as ``torch.optim.Optimizer.state`` is to a user: one mapping for
    the optimiser's life, parameter -> its state dict, the very dict its owner steps
    with (an in-backward table's, whose tensors the backward updates, or a part's
    ``state[p]``), so ``opt.state[p]`` is the same dict at each access and what is
    written into it stays.  Nothing is copied: a part's ``load_state_dict``, which
    replaces its ``state``, shows here at once.  A key held nowhere is made as a
    ``defaultdict(dict)`` makes it, in the part whose groups hold that parameter (else
    here, for a tensor of no part).  A table's entry cannot be replaced nor deleted
    (its backward reads it): ``NotImplementedError``."""

    def __init__(self, tables: Dict[Tensor, Dict[str, Any]], parts: Dict[str, Optimizer]
                 ) -> None:
        self._tables = tables
        self._parts = parts  # the optimiser's own dict of parts: read at each access
        self._other: DefaultDict[Any, Dict[str, Any]] = defaultdict(dict)

    def _holder(self, key: Any) -> Optional[Dict[Any, Any]]:
        """The mapping holding ``key``, without making it."""
        if key in self._tables:
            return self._tables
        for part in self._parts.values():
            if key in part.state:
                return part.state
        return self._other if key in self._other else None

    def _maker(self, key: Any) -> Dict[Any, Any]:
        """Where a new entry for ``key`` goes: the state of the part training it."""
        for part in self._parts.values():
            if any(p is key for group in part.param_groups for p in group["params"]):
                return part.state
        return self._other

    def _refuse(self, key: Any, what: str) -> None:
        if key in self._tables:
            raise NotImplementedError(
                f"optimizer.state: cannot {what} the entry of an in-backward weight of shape "
                f"{tuple(key.shape)}: it is its table's state, which the layer's backward "
                f"updates; change its tensors in place (optimizer.state[p]['step'].fill_(0)) "
                f"or use load_state_dict")

    def __getitem__(self, key: Any) -> Dict[str, Any]:
        holder = self._holder(key)
        return cast(Dict[str, Any], (self._maker(key) if holder is None else holder)[key])

    def __setitem__(self, key: Any, value: Dict[str, Any]) -> None:
        self._refuse(key, "replace")
        holder = self._holder(key)
        (self._maker(key) if holder is None else holder)[key] = value

    def __delitem__(self, key: Any) -> None:
        self._refuse(key, "delete")
        holder = self._holder(key)
        if holder is None:
            raise KeyError(key)
        del holder[key]

    def __iter__(self) -> Iterator[Any]:
        yield from self._tables
        for part in self._parts.values():
            yield from part.state
        yield from self._other

    def __len__(self) -> int:
        return (len(self._tables) + sum(len(part.state) for part in self._parts.values())
                + len(self._other))

    def __contains__(self, key: Any) -> bool:
        return self._holder(key) is not None

    # a defaultdict's: these make no entry
    def get(self, key: Any, default: Any = None) -> Any:
        holder = self._holder(key)
        return default if holder is None else holder[key]

    def pop(self, key: Any, *default: Any) -> Any:
        holder = self._holder(key)
        if holder is None:
            if default:
                return default[0]
            raise KeyError(key)
        self._refuse(key, "delete")
        return holder.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        for key in self._tables:  # refused before anything is deleted
            self._refuse(key, "delete")
        for part in self._parts.values():
            part.state.clear()
        self._other.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"


def apply_optimizer_in_backward(model: nn.Module, optimizer: str = "adam", *,
                                lr: Optional[float] = None,
                                betas: Tuple[float, float] = (0.9, 0.999),
                                eps: Optional[float] = None,
                                weight_decay: Optional[float] = None, momentum: float = 0.0,
                                nesterov: bool = False,
                                initial_accumulator_value: float = 0.0,
                                dense_above: Optional[float] = None
                                ) -> InBackwardOptimizer:
    r"""Train the sparse layers of ``model`` by an optimiser inside their backward.

    The fastest training step nnsparse offers for a sparse autoencoder: the
    weights of every :class:`~nnsparse.SparseLinearBatch` and
    :class:`~nnsparse.SparseOutputLinear` in ``model`` are updated row by
    row during ``loss.backward()`` and get no ``.grad``; every other
    parameter is trained by torch's optimiser of the same kind.  See
    :class:`InBackwardOptimizer` for the semantics (one step per forward,
    lazy rows, lazy weight decay, what is refused).

    A sparse layer whose weight does not require grad (frozen embeddings,
    fine-tuning the rest) is left alone; when every sparse weight is frozen,
    nothing is updated in the backward and the optimiser is torch's of the
    same kind over the other trainable parameters.  A model holding no sparse
    layer at all is refused (nothing could ever be applied in its backward:
    a mistake, such as passing a sub-module); :func:`fused_step_optimizer`
    takes it, as Adam.

    Args:
        model (nn.Module): holds the sparse layers (built and moved to their
            device and dtype already).  Not a ``DistributedDataParallel`` wrapper.
        optimizer (str): ``"sgd"``, ``"adam"``, ``"adamw"``, ``"adagrad"`` or
            ``"rowwise_adagrad"`` (the other parameters: ``torch.optim.Adagrad``).
            Default: ``"adam"``.
        lr (float, optional): learning rate; default torch's for the kind
            (``1e-3``; ``1e-2`` for the Adagrads).
        betas (Tuple[float, float]): Adam's.  Default: ``(0.9, 0.999)``.
        eps (float, optional): default torch's for the kind.
        weight_decay (float, optional): default torch's for the kind (``1e-2``
            for AdamW, else 0).
        momentum (float): SGD's (no dampening).  Default: 0.
        nesterov (bool): SGD's.  Default: ``False``.
        initial_accumulator_value (float): the Adagrads'.  Default: 0.
        dense_above (float, optional): when one step touches more than this
            share of a table's rows, the table takes the dense step of
            ``optimizer`` (untouched rows get a zero gradient: their state
            decays and, for Adam, they move; weight decay applies to every
            row), in blocks, instead of the lazy one.  ``None``: always lazy.
            (``sgd`` without momentum and the Adagrads, without weight decay,
            take their dense step above 25 % of the rows whatever this says:
            for them it equals the lazy step.)  Default: ``None``.

    Returns:
        InBackwardOptimizer: call its ``zero_grad()`` and ``step()`` as a torch optimiser's.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or ``optimizer`` is not a str.
        ValueError: unknown ``optimizer``, an invalid hyperparameter, one not
            used by ``optimizer`` (``momentum`` for Adam), no
            ``SparseLinearBatch`` or ``SparseOutputLinear`` in ``model`` (frozen
            ones count), no parameter of ``model`` that requires grad, a
            layer already attached to another one, or a trained layer's weight not
            stored as the layer made it (a ``SparseLinearBatch``'s ``weight.t()``
            contiguous: a row-major Parameter assigned; a ``SparseOutputLinear``'s
            ``weight`` contiguous).
        NotImplementedError: ``model`` is wrapped in ``DistributedDataParallel``, a
            sparse layer's weight is shared with another module (tied weights), or
            is parametrized or pruned and requires grad.

    Example::

        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3), torch.nn.Tanh())
        >>> opt = nnsparse.optim.apply_optimizer_in_backward(model, "adam", lr=0.1)
        >>> x = torch.tensor([[0., 1, 0, 0, 2, 0]]).to_sparse()
        >>> before = model[0].weight.detach().clone()
        >>> opt.zero_grad()
        >>> model(x).sum().backward()   # updates the weight's columns 1 and 4
        >>> opt.step()                  # updates the bias
        >>> model[0].weight.grad is None
        True
        >>> (model[0].weight.detach() != before).any(0).nonzero().flatten()
        tensor([1, 4])
    """
    _check_model(model, "apply_optimizer_in_backward")
    if not isinstance(optimizer, str):
        raise _kind_not_a_str("optimizer", optimizer, _rowopt.KINDS,
                              "apply_optimizer_in_backward(model, {kind!r}, lr=...)")
    if optimizer not in _rowopt.KINDS:
        lower = optimizer.lower().replace("-", "_").replace("row_wise", "rowwise")
        named = f" (did you mean {lower!r}?)" if lower in _rowopt.KINDS else ""
        raise ValueError(f"optimizer must be one of {_rowopt.KINDS}, got {optimizer!r}{named}")
    hp = _in_backward_hp(optimizer, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         momentum=momentum, nesterov=nesterov,
                         initial_accumulator_value=initial_accumulator_value,
                         dense_above=dense_above)
    if not _holds_sparse_layer(model):
        # frozen sparse layers are a set-up (the rest is trained); none at all, a mistake
        raise ValueError(f"model must hold a SparseLinearBatch or SparseOutputLinear, found "
                         f"none in {type(model).__name__}: nothing can be updated in the "
                         f"backward; use torch.optim, or nnsparse.optim.fused_step_optimizer "
                         f"(Adam for any model)")
    return InBackwardOptimizer(model, optimizer, hp)


def _optimizer_name(cls: type) -> str:
    """``torch.optim.Adam`` for the class ``torch.optim.adam.Adam`` (its public path)."""
    module = "torch.optim" if cls.__module__.startswith("torch.optim.") else cls.__module__
    return f"{module}.{cls.__qualname__}"


def _is_optimizer(value: Any) -> bool:
    """``value`` is an optimiser, instance or class (``torch.optim.Adam(...)`` or ``Adam``)."""
    return isinstance(value, Optimizer) or (isinstance(value, type)
                                            and issubclass(value, Optimizer))


def _kind_not_a_str(name: str, value: Any, kinds: Tuple[str, ...], call: str) -> TypeError:
    """The error for an optimiser kind ``name`` (one of ``kinds``) given as no str.  A
    ``torch.optim`` class (TorchRec's ``apply_optimizer_in_backward`` takes it) or instance
    (``torch.optim.Adam(model.parameters())``, what a port passes) is named with the str of
    its kind; an instance by its class (its repr is its param groups, a dozen lines).
    ``call`` is the call to make, with ``{kind!r}`` for the kind."""
    got = f"{type(value).__name__} {value!r}"
    hint = ""
    if _is_optimizer(value):
        cls = value if isinstance(value, type) else type(value)
        # Adam -> 'adam', SparseAdam -> 'sparse_adam', LazyAdam -> 'lazy_adam'
        kind = {k.replace("_", ""): k for k in kinds}.get(cls.__name__.lower())
        if isinstance(value, type):
            if kind is not None:
                hint = f"; name {_optimizer_name(cls)}'s kind as the str {kind!r}"
        else:
            got = f"an instance of {_optimizer_name(cls)}"
            hint = (f"; name its kind as the str {kind!r} and its hyperparameters as keywords, "
                    f"{call.format(kind=kind)}: the optimiser is built by the call, not given"
                    if kind is not None else
                    f"; the optimiser is built by the call, not given: name one of the kinds")
    return TypeError(f"{name} must be one of {kinds} (a str), got {got}{hint}")


def _not_a_module(model: Any, call: str) -> TypeError:
    """The error for a ``model`` that is no ``nn.Module``; for ``model.parameters()`` (what
    ``torch.optim`` takes, so what a port from it passes first) or an optimiser (instance or
    class) it says to pass the model."""
    hint = ""
    if isinstance(model, (list, tuple, Iterator)) and not isinstance(model, (str, bytes)):
        hint = (f"; pass the model itself, {call}(model, ...), not model.parameters(): it "
                f"finds the sparse layers in the model (torch.optim takes the parameters)")
    elif _is_optimizer(model):
        cls = model if isinstance(model, type) else type(model)
        what = (f"the class {_optimizer_name(cls)}" if isinstance(model, type)
                else f"an instance of {_optimizer_name(cls)}")
        hint = (f"; pass the model itself, {call}(model, ...), not an optimiser ({what}): it "
                f"finds the sparse layers in the model")
    return TypeError(f"model must be an nn.Module, got {type(model).__name__}{hint}")


def _check_model(model: Any, call: str) -> None:
    """The model of an optimiser in the backward: an ``nn.Module``, not DDP-wrapped."""
    if not isinstance(model, nn.Module):
        raise _not_a_module(model, call)
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise NotImplementedError(
            "model: the optimiser in the backward updates rows from each process's local "
            "gradient, which DistributedDataParallel never all-reduces; use materialised "
            "gradients (torch.optim or nnsparse.optim.LazyAdam) under DDP")


def _in_backward_hp(kind: str, *, lr: Optional[float], betas: Any, eps: Optional[float],
                    weight_decay: Optional[float], momentum: Any = 0.0, nesterov: Any = False,
                    initial_accumulator_value: Any = 0.0,
                    dense_above: Optional[float] = None) -> Dict[str, Any]:
    """The checked hyperparameters of ``kind``, torch's defaults where ``None``."""
    _check_betas(betas)  # before tuple(betas): a float gave "'float' object is not iterable"
    hp: Dict[str, Any] = dict(_DEFAULTS[kind])
    hp.update({k: v for k, v in dict(lr=lr, eps=eps, weight_decay=weight_decay).items()
               if v is not None})
    nesterov = as_flag(nesterov, "nesterov")  # stored a bool (a numpy bool passes)
    hp.update(betas=tuple(betas), momentum=momentum, nesterov=nesterov,
              initial_accumulator_value=initial_accumulator_value, dense_above=dense_above)
    _check_hyper(kind, hp)
    _check_share(dense_above)
    return _numbers(hp)


def fused_step_optimizer(model: nn.Module, lr: float = 1e-3, *,
                         betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                         weight_decay: float = 0.0,
                         dense_above: Optional[float] = DENSE_ABOVE) -> InBackwardOptimizer:
    r"""The fastest training step measured for a sparse autoencoder, as an optimiser.

    Adam with the arguments of ``torch.optim.Adam`` (``weight_decay`` as L2 in
    the gradient), applied inside the backward of the model's
    :class:`~nnsparse.SparseLinearBatch` and :class:`~nnsparse.SparseOutputLinear`
    weights (:func:`apply_optimizer_in_backward` with ``"adam"``): a drop-in
    for ``torch.optim.Adam(model.parameters(), ...)`` in a loop of
    ``zero_grad(); loss.backward(); step()``.  A step that touches more than
    ``dense_above`` of a weight's rows is exactly Adam's (the untouched rows
    get a zero gradient); a step that touches fewer is lazy: the untouched
    rows (users, for an item autoencoder) keep their weight and moments, and
    are not decayed.  See ``docs/fused_step.md`` for the measurements and the
    other modes.

    Sparse layers whose weight does not require grad are left alone; a model
    with no trainable sparse weight (all frozen, or no sparse layer at all)
    gets ``torch.optim.Adam(fused=True)`` over its trainable parameters,
    behind the same interface, so the drop-in holds for any model.

    Args:
        model (nn.Module): holds the sparse layers, on their device and dtype.
        lr (float): learning rate.  Default: ``1e-3``.
        betas (Tuple[float, float]): Adam's.  Default: ``(0.9, 0.999)``.
        eps (float): Adam's.  Default: ``1e-8``.
        weight_decay (float): L2, lazy on the sparse weights.  Default: 0.
        dense_above (float, optional): see :func:`apply_optimizer_in_backward`.
            Default: ``nnsparse.optim.DENSE_ABOVE`` (0.1, the measured crossover).

    Returns:
        InBackwardOptimizer

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or a hyperparameter is not a number.
        ValueError: an invalid hyperparameter, no parameter of ``model`` that
            requires grad, or a layer already attached to another optimiser in
            the backward.
        NotImplementedError: as :func:`apply_optimizer_in_backward`
            (``DistributedDataParallel``, tied weights).

    Example::

        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3), torch.nn.Tanh())
        >>> opt = nnsparse.optim.fused_step_optimizer(model, lr=0.01)
        >>> opt.kind
        'adam'
    """
    _check_model(model, "fused_step_optimizer")
    hp = _in_backward_hp("adam", lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         dense_above=dense_above)
    # no sparse layer, or only frozen ones: InBackwardOptimizer is then torch's fused Adam
    # over the trainable parameters alone (the drop-in)
    return InBackwardOptimizer(model, "adam", hp)


def _number(value: Any, keep_tensor: bool = False) -> Any:
    """A checked hyperparameter as torch's kernels take it (read once, where it is given): a
    one-element tensor, a ``Fraction`` or a numpy number such as ``np.float32`` as a Python
    float; ints, floats, bools and ``None`` as they are.  The in-backward kernels
    and torch's optimisers take some as numbers only (SGD's ``add_(alpha=lr)``, Adam's
    ``eps``, the fused Adam's every one): a ``(1,)`` tensor or a ``Fraction`` failed at the
    first step, inside torch.  ``keep_tensor``: a tensor stays one (a learning rate, which
    torch's Adam and the fused kernels take as a tensor)."""
    if value is None or isinstance(value, (float, int)):  # (bool is an int; the fast path)
        return value
    if isinstance(value, Tensor):
        return value if keep_tensor else float(value.detach())
    if isinstance(value, numbers.Real):
        return real_float(value)  # Fraction, numpy floats (np.float32 is no float)
    return value


# the hyperparameters of LazyAdam's groups and make_optimizer's that _hyper_numbers converts
_HYPER_KEYS = ("lr", "eps", "weight_decay", "dense_above")


def _hyper_numbers(hp: Dict[str, Any]) -> Dict[str, Any]:
    """Checked ``hp`` of a torch-style optimiser as its kernels take them
    (:func:`_number`): ``lr`` a tensor if given one, ``eps``, ``weight_decay`` and
    ``dense_above`` numbers, ``betas`` a pair of numbers (torch's Adam refuses a float
    beside a tensor) unless both are tensors (which torch's Adam takes and reads at each
    step: kept, as a tensor ``lr`` is); absent keys, a group's ``params`` and any other
    key (a group may hold keys of the user's own, as torch's do) stay as they are."""
    out = {k: _number(v, keep_tensor=k == "lr") if k in _HYPER_KEYS else v
           for k, v in hp.items()}
    if "betas" in hp and not _tensor_pair(hp["betas"]):
        out["betas"] = tuple(_number(b) for b in hp["betas"])
    return out


def _tensor_pair(betas: Any) -> bool:
    """``betas`` (checked: a pair) are two tensors, as torch's Adam takes them."""
    return isinstance(betas[0], Tensor) and isinstance(betas[1], Tensor)


def _numbers(hp: Dict[str, Any]) -> Dict[str, Any]:
    """``hp`` (checked) with its tensor numbers as floats (:func:`_number`), betas included."""
    out = {k: _number(v) for k, v in hp.items()}
    out["betas"] = tuple(_number(b) for b in hp["betas"])
    return out


def _check_non_negative(name: str, value: Any) -> None:
    check_real(name, value)
    if not value >= 0.0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    number = float(value) if isinstance(value, Tensor) else real_float(value)
    if number == math.inf:
        # (10**400 too: float() of it overflowed at the first step, "int too large to
        # convert to float")
        raise ValueError(f"{name} must be finite, got "
                         f"{number if isinstance(value, Tensor) else value}")


def _check_closure(closure: Any) -> None:
    if closure is not None and not callable(closure):
        raise TypeError(f"closure must be None or a callable, got {type(closure).__name__}")


def _closure_loss(closure: Any) -> Optional[float]:
    """An optimiser step's ``closure()`` (checked), evaluated with autograd on; ``None`` without."""
    _check_closure(closure)
    if closure is None:
        return None
    with torch.enable_grad():
        return cast(Optional[float], closure())  # (torch types a closure's loss as float)


def _check_betas(betas: Any, name: str = "betas") -> None:
    if not isinstance(betas, (tuple, list)):
        raise TypeError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    if len(betas) != 2:
        raise ValueError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    for value in betas:
        check_real(name, value)
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {betas}")


def _check_share(dense_above: Optional[float], name: str = "dense_above") -> None:
    if dense_above is None:
        return
    check_real(name, dense_above)
    if not 0.0 <= dense_above <= 1.0:
        raise ValueError(f"{name} must be None or in [0, 1], got {dense_above}")


def _check_hyper(kind: str, hp: Dict[str, Any]) -> None:
    for key in ("lr", "eps", "weight_decay", "momentum", "initial_accumulator_value"):
        _check_non_negative(key, hp[key])
    _check_betas(hp["betas"])
    as_flag(hp["nesterov"], "nesterov")
    if kind != "sgd" and (hp["momentum"] or hp["nesterov"]):
        raise ValueError(f"momentum and nesterov are SGD's, got momentum={hp['momentum']}, "
                         f"nesterov={hp['nesterov']} for optimizer={kind!r}")
    if hp["nesterov"] and not hp["momentum"]:
        raise ValueError("nesterov=True needs momentum > 0, got momentum=0")
    if kind not in ("adagrad", "rowwise_adagrad") and hp["initial_accumulator_value"]:
        raise ValueError(f"initial_accumulator_value is Adagrad's, got "
                         f"{hp['initial_accumulator_value']} for optimizer={kind!r}")
