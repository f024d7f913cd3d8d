"""One optimiser object for a model whose gradients are partly sparse, partly dense.

``torch.optim.Adam`` refuses sparse gradients ("Adam does not support sparse
gradients, please consider SparseAdam instead") and ``torch.optim.SparseAdam``
refuses dense ones, so a model with ``sparse_grad=True`` layers beside dense
ones needs its parameters split between two optimisers.
:func:`make_optimizer` does the split (by module, before any backward) and
returns one :class:`SplitOptimizer` with the usual ``step`` / ``zero_grad`` /
``state_dict`` / ``load_state_dict`` and ``param_groups``, so a training loop
and an LR scheduler use it as any optimiser.
"""
from __future__ import annotations

import copy
import inspect
from collections import OrderedDict
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple,
                    overload)

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from ._forms import as_flag
from .optim import (_HOOK_TABLES, _NOT_PICKLED, InBackwardOptimizer, _check_state_entries,
                     _check_torch_groups, _closure_loss, _JoinedState, _kind_not_a_str,
                     _load_with_hooks, _not_a_module, _state_dict_with_hooks, _state_keys,
                     _step_part)

__all__ = ["make_optimizer", "SplitOptimizer", "sparse_grad_parameters"]

_SPARSE = ("lazy_adam", "sparse_adam")
# the hook tables of torch.optim.Optimizer (its register_*_hook methods write them)
_DENSE = ("adam", "adamw")
# Adam switches that change what the step computes and that the sparse part lacks
_SPARSE_LACKS = ("maximize", "amsgrad", "differentiable")
# torch.optim.Adam / AdamW's switches, checked before torch takes them (it stores any
# value: foreach="x" and maximize=1 were kept, differentiable=None failed at the first
# step): name -> whether None is accepted (torch's default None: it picks the kernel)
_DENSE_FLAGS = {"amsgrad": False, "maximize": False, "capturable": False,
                "differentiable": False, "decoupled_weight_decay": False,
                "foreach": True, "fused": True}


def _gives_sparse_grad(module: nn.Module) -> bool:
    """Whether ``module``'s own parameters get sparse COO gradients in training."""
    from .layers.linear import SparseLinearBatch, _parametrized_weight
    from .layers.sparse_output import SparseOutputLinear
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return bool(module.sparse)
    if isinstance(module, (SparseLinearBatch, SparseOutputLinear)):
        # a parametrized weight takes no sparse gradient: the layer's calls are then dense,
        # its bias's gradient too (the layers' forward)
        return bool(module.sparse_grad) and not _parametrized_weight(module)
    return False


def sparse_grad_parameters(model: nn.Module) -> List[Tensor]:
    r"""The parameters of ``model`` that get sparse COO gradients, each once.

    These are every parameter of ``nn.Embedding`` / ``nn.EmbeddingBag`` with
    ``sparse=True``, :class:`~nnsparse.SparseLinearBatch` with
    ``sparse_grad=True`` (``weight_t`` and ``bias``) and
    :class:`~nnsparse.SparseOutputLinear` with ``sparse_grad=True``
    (``weight`` and ``bias``; their gradients are sparse when the layer is
    given a pattern, as in training).  Parameters with
    ``requires_grad=False`` are left out, and so are those of a layer whose
    weight is parametrized (``torch.nn.utils.parametrize``), whose gradients
    are dense.

    Args:
        model (nn.Module): any module; its submodules are searched.

    Returns:
        List[Tensor]: the parameters, in ``model.modules()`` order, each once.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Example::

        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3, sparse_grad=True),
        ...                             torch.nn.Linear(3, 2))
        >>> [tuple(p.shape) for p in nnsparse.sparse_grad_parameters(model)]
        [(6, 3), (3,)]
    """
    if not isinstance(model, nn.Module):
        raise _not_a_module(model, "sparse_grad_parameters")
    seen: Set[int] = set()
    out: List[Tensor] = []
    for module in model.modules():
        if not _gives_sparse_grad(module):
            continue
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _sparse_capable() -> Tuple[type, ...]:
    from .optim import LazyAdam
    return (torch.optim.SparseAdam, LazyAdam, torch.optim.SGD, torch.optim.Adagrad)


class SplitOptimizer(Optimizer):
    r"""Several optimisers over disjoint parameters, driven as one.

    ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` go to each
    part; ``param_groups`` is the concatenation of theirs (the same dicts, so
    an LR scheduler that edits ``group["lr"]`` reaches every part).

    Args:
        optimizers (dict): name -> optimiser; names key the state dict.

    Raises:
        TypeError: ``optimizers`` is not a dict keyed by str, a value is not a
            ``torch.optim.Optimizer`` (or is an in-backward one).
        ValueError: no optimiser, or a parameter in two of them.

    Example::

        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3, sparse_grad=True),
        ...                             torch.nn.Linear(3, 2))
        >>> opt = nnsparse.make_optimizer(model, lr=0.01)   # a SplitOptimizer
        >>> opt
        SplitOptimizer(dense=Adam, sparse=LazyAdam)
        >>> list(opt.state_dict())
        ['dense', 'sparse']
        >>> nnsparse.SplitOptimizer({"sgd": torch.optim.SGD(model[1].parameters(), lr=0.1)})
        SplitOptimizer(sgd=SGD)
    """

    def __init__(self, optimizers: Dict[str, Optimizer]) -> None:
        if not isinstance(optimizers, dict):
            raise TypeError(f"optimizers must be a dict of name -> optimiser, got "
                            f"{type(optimizers).__name__}")
        if not optimizers:
            raise ValueError("optimizers must hold at least one optimiser, got none")
        seen: Set[int] = set()
        for name, opt in optimizers.items():
            if not isinstance(name, str):
                raise TypeError(f"optimizers must be keyed by part names (str), got "
                                f"{type(name).__name__} {name!r}")
            if not isinstance(opt, Optimizer):
                raise TypeError(f"optimizers[{name!r}] must be a torch.optim.Optimizer, "
                                f"got {type(opt).__name__}")
            if isinstance(opt, InBackwardOptimizer):
                # an Optimizer (so LR schedulers drive it), but one for a whole model
                # already, its dense part included, with a state dict of its own form
                raise TypeError(f"optimizers[{name!r}] is an InBackwardOptimizer, which "
                                f"trains a whole model (its other parameters by its dense "
                                f"part): use it alone, not as a part of a SplitOptimizer")
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            if ids & seen:
                raise ValueError(f"optimizers[{name!r}] shares parameters with another part")
            seen |= ids
        # No Optimizer.__init__: the parts own the parameters and their state.
        self.optimizers = dict(optimizers)
        # the settings every part has (the first part's values): what schedulers
        # read, e.g. OneCycleLR's "betas" or "momentum" check
        parts = list(self.optimizers.values())
        self.defaults: Dict[str, Any] = {k: v for k, v in parts[0].defaults.items()
                                         if all(k in o.defaults for o in parts[1:])}
        self._init_hooks()
        self._state = _JoinedState({}, self.optimizers)

    def _init_hooks(self) -> None:
        # Optimizer.__init__'s hook tables, which its register_*_hook methods fill
        # (OrderedDicts: torch's RemovableHandle keeps a weak reference to them)
        for name in _HOOK_TABLES:
            if name not in self.__dict__:
                setattr(self, name, OrderedDict())

    def __getstate__(self) -> Dict[str, Any]:
        # Optimizer's keeps defaults, state and param_groups: the parts are the state
        return {k: v for k, v in self.__dict__.items() if k not in _NOT_PICKLED}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_hooks()
        self._state = _JoinedState({}, self.optimizers)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> _JoinedState:  # type: ignore[override]
        """Per-parameter state, as ``torch.optim.Optimizer.state``: one mapping for the
        optimiser's life, parameter -> the state dict of the part training it (the very
        dict that part steps with: the same at each access, keys written into it stay).
        A key the part's optimiser does not keep is saved by :meth:`state_dict` but
        refused by :meth:`load_state_dict` (``ValueError``, as the state of another
        optimiser): delete it before saving."""
        return self._state

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    # torch's wrapper (no Optimizer.__init__ here to put it on): the step hooks, and the
    # global ones of torch.optim.optimizer once per step, with this optimiser
    @Optimizer.profile_hook_step
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One step of every part; ``closure`` (if given) is evaluated once, first.
        The hooks of ``register_step_pre_hook`` / ``_post_hook`` run around it, with
        torch's arguments, and the global ones of ``torch.optim.optimizer`` once (not
        once per part), as around a torch optimiser's step; each part's own hooks run
        around its step.

        Raises:
            TypeError: before any parameter changes, when a part's
                ``param_groups`` hold something else than a tensor (replaced by
                hand since).
            RuntimeError: before any parameter changes, when a part would fail
                half-way (a gradient of a layout it does not take) or two parts
                now share a parameter (one's ``add_param_group`` took another's).
        """
        loss = _closure_loss(closure)
        self._check_gradients()  # every part's, before any parameter changes
        for opt in self.optimizers.values():
            _step_part(opt)
        return loss

    def _check_gradients(self) -> None:
        """Refuse a step that a part would fail half-way (after others have stepped)."""
        from .optim import LazyAdam
        owner: Dict[int, str] = {}  # a part's add_param_group may have taken another's
        for name, opt in self.optimizers.items():
            for i, group in enumerate(opt.param_groups):
                for j, p in enumerate(group["params"]):
                    if not isinstance(p, Tensor):  # replaced by hand since
                        raise TypeError(f"optimizers[{name!r}].param_groups[{i}]['params'][{j}] "
                                        f"must be a tensor, got {type(p).__name__}")
                    other = owner.setdefault(id(p), name)
                    if other != name:
                        raise RuntimeError(
                            f"optimizers[{other!r}] and optimizers[{name!r}] share a parameter "
                            f"of shape {tuple(p.shape)} (added to one since the SplitOptimizer "
                            f"was built): each step would update it twice; remove it from one "
                            f"part (no parameter was changed)")
        for name, opt in self.optimizers.items():
            if isinstance(opt, LazyAdam):
                opt._checked_work()  # its own checks: groups, gradient layouts
            takes_sparse = isinstance(opt, _sparse_capable())
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if isinstance(opt, torch.optim.SparseAdam) and not p.grad.is_sparse:
                        raise RuntimeError(
                            f"optimizers[{name!r}] is SparseAdam, which takes sparse gradients "
                            f"only, got a dense one for a parameter of shape {tuple(p.shape)} "
                            f"(a layer without sparse_grad=True, or one run under torch.compile, "
                            f"torch.jit.trace, with a parametrized weight or one given as a view); "
                            f"nnsparse.optim.LazyAdam takes both "
                            f"(no parameter was changed)")
                    if p.grad.is_sparse and not takes_sparse:
                        raise RuntimeError(
                            f"optimizers[{name!r}] ({type(opt).__name__}) takes dense gradients "
                            f"only, got a sparse one for a parameter of shape {tuple(p.shape)}; "
                            f"nnsparse.make_optimizer(model) puts sparse-gradient parameters in "
                            f"their own part (no parameter was changed)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        as_flag(set_to_none, "set_to_none")
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        """``{part name: part.state_dict()}``, through the hooks registered with
        ``register_state_dict_pre_hook`` / ``_post_hook`` as torch's optimisers call them."""
        return _state_dict_with_hooks(
            self, lambda: {name: opt.state_dict() for name, opt in self.optimizers.items()})

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a :meth:`state_dict`: every part's state checked before any is loaded;
        the ``register_load_state_dict_pre_hook`` / ``_post_hook`` hooks are called as
        torch's optimisers call them.

        A part's state tensors must have the shape its optimiser keeps there: their
        parameter's (0-d ones pass: a step count), or for ``torch.optim.Adafactor``'s
        ``row_var`` / ``col_var`` the parameter's shape with 1 at the last /
        second-to-last dimension, for ``torch.optim.LBFGS``'s ``d`` / ``prev_flat_grad``
        one vector of all its (first group's) parameters' entries.

        Raises:
            TypeError: ``state_dict`` not a dict of part name -> optimiser state dict, or
                a part's state of the wrong form.
            ValueError: other part names than this optimiser's; a part's state tensor
                of another shape than above, or another of the checks of
                ``LazyAdam.load_state_dict`` and of the parts' group hyperparameters.
                Nothing is loaded then.
        """
        _load_with_hooks(self, state_dict, self._load_parts)

    def _load_parts(self, state_dict: Dict[str, Any]) -> None:
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict of part name -> state, got "
                            f"{type(state_dict).__name__}")
        if set(state_dict) != set(self.optimizers):
            raise ValueError(f"state_dict must have the parts {sorted(self.optimizers)}, "
                             f"got {sorted(state_dict, key=str)}")
        for name, part in state_dict.items():
            if not isinstance(part, dict):
                raise TypeError(f"state_dict[{name!r}] must be an optimiser state dict, "
                                f"got {type(part).__name__}")
        # every part checked before any is loaded (torch's own load checks no entry)
        for name, opt in self.optimizers.items():
            _check_state_entries(state_dict[name], opt, f"state_dict[{name!r}]",
                                 _state_keys(opt))
            _check_torch_groups(state_dict[name], opt, f"state_dict[{name!r}]")
        before = {name: copy.deepcopy(opt.state_dict()) for name, opt in self.optimizers.items()}
        try:
            for name, opt in self.optimizers.items():
                opt.load_state_dict(state_dict[name])
        except Exception:
            # a part refused its state: put back the parts loaded before it
            for name, opt in self.optimizers.items():
                opt.load_state_dict(before[name])
            raise

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise NotImplementedError("a SplitOptimizer cannot tell which part a new group belongs "
                                  "to; add it to one part: optimizer.optimizers['dense' or "
                                  "'sparse'].add_param_group(...)")

    def __iter__(self) -> Iterator[Tuple[str, Optimizer]]:
        return iter(self.optimizers.items())

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={type(o).__name__}" for n, o in self.optimizers.items())
        return f"SplitOptimizer({parts})"


def _decay_groups(params: Sequence[Tensor], weight_decay: float, matrices_only: bool) -> Any:
    """``params`` as they are, or (``matrices_only``) in two param groups: ``weight_decay``
    on the matrices (``dim >= 2``), none on the rest (an empty group left out)."""
    if not matrices_only:
        return params
    groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=weight_decay),
              dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
    return [g for g in groups if g["params"]]


def _sparse_part(name: str, params: Any, lr: float, betas: Tuple[float, float],
                 eps: float, weight_decay: float, decoupled: bool) -> Optimizer:
    if name == "lazy_adam":
        from .optim import LazyAdam
        return LazyAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=decoupled)
    if weight_decay:
        raise NotImplementedError("sparse='sparse_adam' has no weight decay (torch.optim."
                                  f"SparseAdam), got weight_decay={weight_decay}; use "
                                  "sparse='lazy_adam'")
    return torch.optim.SparseAdam(params, lr=lr, betas=betas, eps=eps)


def _check_dense_kwargs(cls: type, dense_kwargs: Dict[str, Any]) -> None:
    """The extra keywords against the dense optimiser's own (before anything is built)."""
    taken = {"lr", "betas", "eps", "weight_decay"}
    accepted = [name for name in inspect.signature(cls).parameters
                if name != "params" and name not in taken]
    unknown = sorted(set(dense_kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"dense_kwargs: torch.optim.{cls.__name__} takes no keyword(s) {unknown}; "
                        f"it takes {sorted(accepted)} (lr, betas, eps and weight_decay are "
                        f"make_optimizer's own)")


def _checked_flags(dense_kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``dense_kwargs`` with its switches (:data:`_DENSE_FLAGS`) checked: a bool (a numpy
    bool passes, as a Python bool) or, for ``foreach`` and ``fused``, ``None``; anything
    else (a str, an int 0/1, a tensor) is a ``TypeError`` naming the keyword."""
    out = dict(dense_kwargs)
    for key, none_ok in _DENSE_FLAGS.items():
        if key in out and not (none_ok and out[key] is None):
            out[key] = as_flag(out[key], key, "None or a bool" if none_ok else "a bool")
    return out


def make_optimizer(model: nn.Module, lr: float = 1e-3, *, betas: Tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, weight_decay: float = 0.0, dense: str = "adam",
                   sparse: str = "lazy_adam", decay_matrices_only: bool = False,
                   **dense_kwargs: Any) -> Optimizer:
    r"""Adam for a model mixing sparse and dense gradients, as one optimiser.

    The parameters that get sparse gradients (:func:`sparse_grad_parameters`:
    ``SparseLinearBatch(sparse_grad=True)``, ``SparseOutputLinear(sparse_grad=True)``,
    ``nn.Embedding(sparse=True)``) go to a sparse-capable optimiser, the
    others to ``torch.optim.Adam`` / ``AdamW`` (with its fast ``foreach`` or
    ``fused`` kernels).  When all parameters fall on one side, that
    optimiser alone is returned; otherwise a :class:`SplitOptimizer` whose
    parts are named ``"dense"`` and ``"sparse"``.

    Args:
        model (nn.Module): the model (its ``sparse_grad`` settings are read
            now, so build the optimiser after the model).
        lr, betas, eps: Adam's, the same for both parts.
        weight_decay (float): Adam's L2 penalty (``dense="adam"``) or AdamW's
            decoupled decay (``dense="adamw"``); on the sparse part it is
            :class:`~nnsparse.optim.LazyAdam`'s lazy decay, of the same kind.
        dense (str): ``"adam"`` or ``"adamw"``.
        sparse (str): ``"lazy_adam"`` (:class:`nnsparse.optim.LazyAdam`, with
            weight decay) or ``"sparse_adam"`` (``torch.optim.SparseAdam``,
            without).
        decay_matrices_only (bool): ``weight_decay`` on the parameters with
            ``dim >= 2`` only, none on biases and other vectors (each part then
            has two param groups), as :class:`nnsparse.models.Trainer` trains.
            Default: on every parameter.
        **dense_kwargs: passed to the dense optimiser (``foreach``, ``fused``,
            ``amsgrad``, ...); those that change the step (``maximize``,
            ``amsgrad``, ``differentiable``) only when no parameter gets sparse
            gradients.  The switches must be bools (``foreach`` and ``fused``:
            ``None`` or a bool); a numpy bool is passed on as a Python bool.

    Returns:
        ``torch.optim.Adam``/``AdamW``, the sparse optimiser, or a
        :class:`SplitOptimizer` of both.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``dense`` or ``sparse`` not a
            str, a keyword the dense optimiser does not take, a switch of
            ``dense_kwargs`` of another kind than a bool (``foreach`` and ``fused``:
            ``None`` or a bool; numpy bools pass), checked before anything is built.
        ValueError: an unknown ``dense`` or ``sparse``, an invalid
            hyperparameter (``eps=0`` too with ``sparse="sparse_adam"``, which
            ``torch.optim.SparseAdam`` refuses), or a model without trainable
            parameters.
        NotImplementedError: ``sparse="sparse_adam"`` with ``weight_decay``;
            ``maximize``, ``amsgrad`` or ``differentiable`` in ``dense_kwargs`` when
            some parameters get sparse gradients (the sparse part has none of them).

    Example::

        >>> model = torch.nn.Sequential(nnsparse.SparseLinearBatch(6, 3, sparse_grad=True),
        ...                             torch.nn.Linear(3, 2))
        >>> opt = nnsparse.make_optimizer(model, lr=1e-2)
        >>> opt
        SplitOptimizer(dense=Adam, sparse=LazyAdam)
        >>> model(torch.eye(6)[:2].to_sparse()).sum().backward()
        >>> opt.step(); opt.zero_grad()
    """
    from .optim import _check_betas, _check_non_negative, _hyper_numbers
    if not isinstance(model, nn.Module):
        raise _not_a_module(model, "make_optimizer")
    for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        _check_non_negative(name, value)
    _check_betas(betas)
    # as torch.optim.Adam's kernels take them: a Fraction, a (1,) tensor eps or a tensor
    # beside a float beta failed inside torch, at construction or at the first step
    hp = _hyper_numbers(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
    lr, betas, eps, weight_decay = hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"]
    decay_matrices_only = as_flag(decay_matrices_only, "decay_matrices_only")
    for part, kind, kinds in (("dense", dense, _DENSE), ("sparse", sparse, _SPARSE)):
        if not isinstance(kind, str):
            raise _kind_not_a_str(part, kind, kinds,
                                  f"make_optimizer(model, {part}={{kind!r}}, lr=...)")
        if kind not in kinds:
            raise ValueError(f"{part} must be one of {kinds}, got {kind!r}")
    _check_dense_kwargs(torch.optim.AdamW if dense == "adamw" else torch.optim.Adam,
                        dense_kwargs)
    dense_kwargs = _checked_flags(dense_kwargs)
    sparse_params = sparse_grad_parameters(model)
    if sparse_params and sparse == "sparse_adam" and not eps > 0:
        # torch.optim.Adam takes eps=0, SparseAdam not: its own "Invalid epsilon value: 0.0"
        # came from the part built after the dense one
        raise ValueError(f"eps must be positive with sparse='sparse_adam' (torch.optim."
                         f"SparseAdam refuses 0), got {eps}; use sparse='lazy_adam' for eps=0")
    lacking = [key for key in _SPARSE_LACKS if dense_kwargs.get(key)]
    if sparse_params and lacking:
        # the dense part alone would take them: half the model maximised, or with AMSGrad
        raise NotImplementedError(
            f"dense_kwargs: {', '.join(f'{k}={dense_kwargs[k]!r}' for k in lacking)} would "
            f"apply to the dense parameters only: the sparse-gradient parameters' optimiser "
            f"({sparse!r}) has no {' nor '.join(lacking)}; use torch.optim.Adam with "
            f"sparse_grad=False layers")
    sparse_ids = {id(p) for p in sparse_params}
    dense_params = [p for p in model.parameters() if p.requires_grad and id(p) not in sparse_ids]
    if not sparse_params and not dense_params:
        raise ValueError("model must have parameters that require grad, got none")
    decoupled = dense == "adamw"
    parts: Dict[str, Optimizer] = {}
    if dense_params:
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        parts["dense"] = cls(_decay_groups(dense_params, weight_decay, decay_matrices_only),
                             lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             **dense_kwargs)
    if sparse_params:
        parts["sparse"] = _sparse_part(
            sparse, _decay_groups(sparse_params, weight_decay, decay_matrices_only), lr, betas,
            eps, weight_decay, decoupled)
    return next(iter(parts.values())) if len(parts) == 1 else SplitOptimizer(parts)
