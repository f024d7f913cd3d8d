"""The one training loop of :mod:`nnsparse.models`.

:class:`Trainer` owns the epoch loop, early stopping and the per-epoch
validation.  Its small methods are the places to override: a distributed
trainer replaces :meth:`Trainer.make_loader` (a ``DistributedSampler``),
:meth:`Trainer.is_main` (rank 0 prints), :meth:`Trainer.reduce` (an
all-reduce of the epoch's loss) and :meth:`Trainer.validation_rmse` (one
figure for every rank); :class:`DistributedTrainer` is that trainer, used by
the models' ``fit`` whenever a process group is initialised (``torchrun``).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, cast

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from tqdm import tqdm

from .. import distributed as nd
from .._forms import (as_count, as_device, as_flag, int_of_0d, is_int, is_real,
                      on_cpu_default, real_float, refuse_meta, refuse_meta_device)
from .._optim_split import SplitOptimizer, make_optimizer
from ..optim import LazyAdam
from ..data import SparseRowDataset
from ..data.readers import _records_equal
from ..data.split import (_checked_setattr, _checked_state, _refuse_field_delete,
                          _torch_seed)

__all__ = ["Trainer", "DistributedTrainer", "TrainResult"]


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` learnt about the run.

    Attributes:
        history (list of dict): per epoch ``epoch``, ``train_loss``,
            ``valid_rmse`` (when validated), ``seconds``.
        best_epoch (int): the epoch with the lowest validation RMSE (the last
            epoch without validation).
        best_rmse (float): that RMSE (``nan`` without validation).

    Built by hand, assigned later or loaded from a file (pickle, ``torch.load``), the
    fields are checked as the constructor checks them (a refused assignment leaves the
    record as it was; a field cannot be deleted, ``AttributeError``).  What is appended
    to ``history`` in place is not seen.

    Raises:
        TypeError: ``history`` that is not a list of dicts of str keys and numbers,
            ``best_epoch`` that is not an int, ``best_rmse`` that is not a real number.
        ValueError: ``best_epoch`` negative or beyond ``len(history)``; ``best_rmse``
            negative (NaN passes: no validation).

    Example::

        >>> result = TrainResult([{"epoch": 1, "train_loss": 0.8, "valid_rmse": 0.95}], 1, 0.95)
        >>> result.best_epoch = 2
        Traceback (most recent call last):
            ...
        ValueError: TrainResult.best_epoch must be at most len(history) = 1 (an epoch of the history, 0 for none), got 2
    """

    history: List[Dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    best_rmse: float = math.nan

    def __post_init__(self) -> None:
        # every field checked before any is stored (a numpy int best_epoch as an int)
        checked = {name: _TRAIN_CHECKS[name](getattr(self, name)) for name in _TRAIN_FIELDS}
        _check_best_epoch(checked["best_epoch"], checked["history"])
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field assigned after construction: the constructor's checks first (a refused
        assignment leaves the record as it was)."""
        _checked_setattr(self, name, value, self._checked, _TRAIN_FIELDS)

    def __delattr__(self, name: str) -> None:
        """A field cannot be deleted (``AttributeError``): the record keeps its fields."""
        _refuse_field_delete(self, name, _TRAIN_FIELDS)

    def _checked(self, name: str, value: Any) -> Any:
        value = _TRAIN_CHECKS[name](value)
        if name == "history":
            _check_best_epoch(self.best_epoch, value, "history")
        elif name == "best_epoch":
            _check_best_epoch(value, self.history)
        return value

    def __setstate__(self, state: Any) -> None:
        """Unpickling (``pickle``, ``copy``, ``torch.load``): the constructor's checks."""
        _checked_state(self, state, _TRAIN_FIELDS)

    def __eq__(self, other: object) -> bool:
        """The same fields, NaN equal to NaN (``best_rmse`` is NaN without validation): a
        record equals its copy and its reload (the dataclass's ``==`` found a reloaded
        TrainResult unequal to itself without validation).  Unhashable, as a dataclass
        that is not frozen."""
        return cast(bool, _records_equal(self, other, _TRAIN_FIELDS))

    __hash__ = None  # type: ignore[assignment]


#: the fields of :class:`TrainResult`, in ``__init__``'s order
_TRAIN_FIELDS = ("history", "best_epoch", "best_rmse")


def _check_entries(entries: Any, name: str) -> List[Dict[str, Any]]:
    """``entries`` a list of dicts of str keys and real numbers (numpy's too), as
    :meth:`Trainer.fit` and :func:`~nnsparse.models.cross_validate` record them (``name``:
    ``TrainResult.history``, ``CrossValidation.folds``)."""
    if not isinstance(entries, list):
        raise TypeError(f"{name} must be a list of dicts, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TypeError(f"{name} must be a list of dicts, got {type(entry).__name__} at "
                            f"{name.split('.')[-1]}[{i}]")
        for key, value in entry.items():
            if not isinstance(key, str):
                raise TypeError(f"{name}[{i}] keys must be str, got {type(key).__name__} "
                                f"{key!r}")
            if not is_real(value):  # (not a bool, nor a numpy timedelta64)
                raise TypeError(f"{name}[{i}][{key!r}] must be a number, got "
                                f"{type(value).__name__} {value!r}")
    return entries


def _check_best_rmse(value: Any) -> float:
    if not is_real(value):
        raise TypeError(f"TrainResult.best_rmse must be a real number (nan without "
                        f"validation), got {type(value).__name__} {value!r}")
    rmse = real_float(value)
    if rmse < 0:
        raise ValueError(f"TrainResult.best_rmse must be a validation RMSE (non-negative, or "
                         f"nan without validation), got {value!r}")
    return rmse


def _check_best_epoch(best_epoch: int, history: List[Dict[str, Any]],
                      assigned: str = "best_epoch") -> None:
    """``best_epoch`` an epoch of ``history`` (``assigned``: the field that changes)."""
    if best_epoch <= len(history):
        return
    if assigned == "history":
        raise ValueError(f"TrainResult.history must hold at least best_epoch = {best_epoch} "
                         f"epochs, got {len(history)}; assign best_epoch first")
    raise ValueError(f"TrainResult.best_epoch must be at most len(history) = {len(history)} "
                     f"(an epoch of the history, 0 for none), got {best_epoch}")


#: each field of :class:`TrainResult` checked on its own (the value to store)
_TRAIN_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "history": lambda v: _check_entries(v, "TrainResult.history"),
    "best_epoch": lambda v: as_count("TrainResult.best_epoch", v, 0, must="non-negative"),
    "best_rmse": _check_best_rmse,
}


def _as_rmse(value: Any) -> float:
    """A ``validate()`` result (a number or a one-element tensor) as a float: an RMSE, so
    never negative (NaN and inf are a diverged model's, which fit never keeps)."""
    if isinstance(value, Tensor) and value.numel() == 1 and not (
            value.dtype == torch.bool or value.is_complex()):
        rmse = float(value)
    elif not is_real(value):  # (not a bool, nor a numpy timedelta64)
        raise TypeError(f"validate must return a number (the validation RMSE), got "
                        f"{type(value).__name__} {value!r}")
    else:
        rmse = real_float(value)  # (10**400: inf, a diverged epoch; float() overflowed)
    if rmse < 0:  # a score where higher is better (-loss): fit would keep the worst epoch
        raise ValueError(f"validate must return the validation RMSE (non-negative, lower is "
                         f"better), got {rmse}; a score where higher is better would make "
                         f"fit keep the worst epoch: return an error instead")
    return rmse


def _show_progress(progress: Optional[bool]) -> bool:
    """``None`` means: a bar only when stderr is a terminal (not in logs or CI)."""
    if progress is None:
        return sys.stderr.isatty()
    return bool(progress)


class Trainer:
    r"""Mini-batch training of a :class:`~nnsparse.models.RatingModel` on its rows.

    One epoch visits every row of the training matrix once in shuffled
    batches; each step computes ``model.batch_loss`` (the data term summed
    over the batch's ratings plus the batch's share of the weight penalty,
    divided by the expected ratings per batch) and an Adam step.  The learning
    rate follows a cosine decay from ``lr`` to ``lr * min_lr_ratio`` over
    ``epochs`` (fixed by ``epochs``, not by where training stops, so a refit
    for fewer epochs retraces the same schedule).

    Args:
        model: the model (its layers built).
        epochs (int): number of epochs (the schedule's length).
        batch_size (int): rows per batch.
        lr (float): Adam's initial learning rate.
        min_lr_ratio (float): final learning rate as a share of ``lr``.
        weight_decay (float): decoupled decay of the parameters of two or more
            dimensions (weight matrices, :class:`KernelNet`'s ``u`` and ``v``), not
            of the biases or other vectors.
        patience (int): stop after this many epochs without a better
            validation RMSE (0: never stop early).
        device (torch.device): where the model runs.
        seed (int): the seed of the shuffling and the corruption.
        progress (bool, optional): tqdm bars; ``None`` shows them only on a terminal.
        log (callable, optional): where the per-epoch lines go (default ``print``);
            ``verbose=False`` models pass a no-op.
    """

    def __init__(self, model: Any, *, epochs: int, batch_size: int, lr: float,
                 min_lr_ratio: float = 0.05, weight_decay: float = 0.0, patience: int = 0,
                 device: torch.device = torch.device("cpu"), seed: int = 0,
                 progress: Optional[bool] = None,
                 log: Optional[Callable[[str], None]] = print) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be an nn.Module (a RatingModel), got "
                            f"{type(model).__name__}")
        # numpy ints pass, as in the models' hyperparameters
        epochs, batch_size = as_count("epochs", epochs, 1), as_count("batch_size", batch_size, 1)
        patience = as_count("patience", patience, 0)
        for name, number in (("lr", lr), ("min_lr_ratio", min_lr_ratio),
                             ("weight_decay", weight_decay)):
            if not is_real(number):  # (not a bool, nor a numpy timedelta64)
                raise TypeError(f"{name} must be a real number, got {type(number).__name__} "
                                f"{number!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        # (an int from 2**1024 is no inf, but float() of it overflowed below: OverflowError)
        if real_float(lr) == math.inf:
            raise ValueError(f"lr must be finite, got {lr!r}")
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
        if real_float(weight_decay) == math.inf:
            raise ValueError(f"weight_decay must be finite, got {weight_decay!r}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay!r}")
        seed = _torch_seed(seed)  # any int, as the models' seed
        if progress is not None:  # numpy bools pass, as in fit (they said "got bool")
            progress = as_flag(progress, "progress", "None or a bool")
        device = as_device(device)
        refuse_meta_device(device)  # (fit said "row_index must hold data" at the first batch)
        if log is not None and not callable(log):
            raise TypeError(f"log must be callable or None, got {type(log).__name__}")
        self.model: Any = model  # a RatingModel, or any module with batch_loss
        self.epochs, self.batch_size, self.lr = int(epochs), int(batch_size), float(lr)
        self.min_lr_ratio, self.patience = float(min_lr_ratio), int(patience)
        self.weight_decay = float(weight_decay)
        self.device, self.seed = torch.device(device), int(seed)
        self.progress = _show_progress(progress)
        self._log = log

    # -- the pieces a subclass replaces ------------------------------------------
    def make_loader(self, dataset: SparseRowDataset) -> DataLoader[Any]:
        """The shuffled loader of the training rows (a distributed trainer adds a sampler)."""
        if not isinstance(dataset, SparseRowDataset):
            raise TypeError(f"dataset must be a SparseRowDataset, got {type(dataset).__name__}")
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True,
                          collate_fn=dataset.collate, generator=generator)

    def make_optimizer(self) -> torch.optim.Optimizer:
        """AdamW: decoupled decay of the matrices (``dim >= 2``), none on biases.

        With ``weight_decay=0`` this is Adam; the papers' penalties are in the
        loss (:meth:`RatingModel.penalty`), on the weights only.  Parameters
        whose gradients are sparse (layers built with ``sparse_grad=True``, see
        :func:`~nnsparse.sparse_grad_parameters`), which AdamW cannot apply,
        get :class:`~nnsparse.optim.LazyAdam` with the same decoupled decay
        rate, applied lazily (to the rows a batch's gradient touches, at that
        step; AdamW decays every row at every step): this is
        :func:`~nnsparse.make_optimizer` with ``dense="adamw"`` and
        ``decay_matrices_only=True``.
        """
        # (make_optimizer's own refusal cannot say that a RatingModel is not built yet)
        if not any(p.requires_grad for p in self.model.parameters()):
            built = getattr(self.model, "_built", True)
            raise ValueError(f"model must have parameters that require grad, got none"
                             + ("" if built else f" ({type(self.model).__name__} is not built: "
                                                 f"RatingModel.fit() builds its layers, then "
                                                 f"trains them with a Trainer)"))
        opt = make_optimizer(self.model, lr=self.lr, weight_decay=self.weight_decay,
                             dense="adamw", decay_matrices_only=True)
        # AdamW alone, else a SplitOptimizer: also when every parameter gets sparse
        # gradients (make_optimizer then returns its one LazyAdam bare)
        return SplitOptimizer({"sparse": opt}) if isinstance(opt, LazyAdam) else opt

    def is_main(self) -> bool:
        """Whether this process prints (rank 0 in a distributed run)."""
        return True

    def reduce(self, value: Tensor) -> Tensor:
        """Combine a per-process sum across processes (identity on one process)."""
        return value

    def validation_rmse(self, validate: Callable[[], float]) -> float:
        """The validation RMSE after an epoch: ``validate()`` (rank 0's, in a distributed trainer)."""
        if not callable(validate):
            raise TypeError(f"validate must be callable, got {type(validate).__name__}")
        return _as_rmse(validate())

    def log(self, message: str) -> None:
        if self._log is not None and self.is_main():
            self._log(message)

    def step(self, batch: Any, optimizer: torch.optim.Optimizer) -> Tensor:
        """One optimisation step on one batch; returns the detached loss (no sync)."""
        _check_step_args(batch, optimizer)
        _check_grad_mode("Trainer.step")
        batch_loss = getattr(self.model, "batch_loss", None)
        if not callable(batch_loss):  # (a subclass overriding step may train another model)
            raise TypeError(f"model must have a batch_loss(rows, x) method for Trainer's "
                            f"step (a RatingModel has one), got {type(self.model).__name__} "
                            f"without one; add it or override Trainer.step")
        batch = batch.to(self.device)
        loss = _checked_loss(batch_loss(batch.row_index, batch.input))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        return loss.detach()

    # -- the loop ---------------------------------------------------------------
    def _lr_at(self, epoch: int) -> float:
        """Cosine decay over ``self.epochs``, evaluated at the start of ``epoch`` (1-based)."""
        t = (epoch - 1) / max(self.epochs - 1, 1)
        low = self.min_lr_ratio
        return self.lr * (low + (1 - low) * 0.5 * (1 + math.cos(math.pi * t)))

    def run_epoch(self, loader: DataLoader[Any], optimizer: torch.optim.Optimizer,
                  epoch: int) -> float:
        # any sized iterable of batches (an overridden make_loader may return a list)
        if isinstance(loader, (str, bytes)) or not (hasattr(loader, "__iter__")
                                                    and hasattr(loader, "__len__")):
            raise TypeError(f"loader must be a DataLoader or another sized iterable of "
                            f"batches (make_loader), got {type(loader).__name__}")
        _check_optimizer(optimizer)
        epoch = as_count("epoch", epoch, 1)
        for group in optimizer.param_groups:
            group["lr"] = self._lr_at(epoch)
        set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
        if set_epoch is not None:  # a DistributedSampler: this epoch's shuffle
            set_epoch(epoch)
        self.model.train()
        # float32 whatever torch's default dtype: a float16 sum of the epoch's losses
        # reached inf past 65504 and read as a diverged epoch
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        bar = tqdm(loader, desc=f"epoch {epoch}/{self.epochs}", leave=False,
                   disable=not (self.progress and self.is_main()))
        for batch in bar:
            total += self.step(batch, optimizer)
        return float(self.reduce(total)) / max(len(loader), 1)

    @on_cpu_default
    def fit(self, x_train: Tensor, validate: Optional[Callable[[], float]] = None,
            epochs: Optional[int] = None) -> TrainResult:
        """Train for ``epochs`` (default ``self.epochs``, at most that) epochs on the rows of
        ``x_train``.

        ``validate`` returns the validation RMSE after an epoch; with it the
        best epoch's weights are restored at the end and training stops after
        ``patience`` epochs without improvement.

        An epoch whose mean training loss is NaN or infinite has diverged (the
        weights are no longer finite, and every later epoch would be too):
        training stops there.  With a validated epoch before it, that epoch's
        weights are kept (the diverged epoch is in ``history``); without one,
        nothing usable is left and ``FloatingPointError`` is raised.  A run without
        ``validate`` also checks, once at its end, its last weights (the last step's,
        which no epoch's loss reads) and, for a
        :class:`~nnsparse.models.RatingModel`, their training loss on the first
        ``batch_size`` rows (uncorrupted, no gradient, in eval mode as ``predict``
        runs it): finite weights can give
        NaN outputs.  Nothing is read per step beyond the epoch's loss.

        It trains on ``self.device``, with the CPU as torch's default device
        (``torch.set_default_device`` and ``with torch.device(...)`` are set
        aside inside, for ``validate`` and the hooks too): tensors made
        without a ``device`` are CPU tensors, as the loop expects.

        Raises:
            FloatingPointError: the training loss became NaN or infinite before
                any validated epoch (e.g. too large an ``lr``), or the run kept its
                last weights and ends diverged: no validation RMSE was finite, or
                (without ``validate``) the trainable parameters are not finite (the
                last step's, which no epoch loss reads), or a RatingModel's training
                loss at them is not.  The model then holds the
                diverged weights, in the train/eval modes it had before the call
                (:meth:`~nnsparse.models.RatingModel.fit` marks itself not fitted).
            ValueError: ``epochs`` beyond ``self.epochs`` (the learning rate's
                schedule ends there); a matrix of the wrong shape, empty or not finite;
                ``validate`` returning a negative number (not an RMSE), after the
                epoch it validated.
            TypeError: ``validate`` returning something else than a number.
            RuntimeError: called with autograd off (``torch.no_grad()``,
                ``torch.set_grad_enabled(False)``, ``torch.inference_mode()``).
        """
        if not isinstance(x_train, Tensor) or x_train.layout not in (torch.sparse_csr,
                                                                     torch.sparse_coo):
            got = x_train.layout if isinstance(x_train, Tensor) else type(x_train).__name__
            raise TypeError(f"x_train must be a sparse CSR or COO tensor (rows, width), "
                            f"got {got}")
        refuse_meta(x_train, "x_train")  # (the finite check read it: torch's .item() error)
        _check_grad_mode(f"{type(self).__name__}.fit")
        if validate is not None and not callable(validate):
            raise TypeError(f"validate must be callable or None, got {type(validate).__name__}")
        epochs = int_of_0d(epochs, "epochs")  # a 0-d integer tensor, as every count takes
        if epochs is not None and not is_int(epochs):
            raise TypeError(f"epochs must be None or an int >= 1, got {epochs!r}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be None or an int >= 1, got {epochs!r}")
        if epochs is not None and epochs > self.epochs:
            # past the schedule the cosine rose again: epoch 2 * epochs - 1 ran at the full lr
            raise ValueError(f"epochs must be at most the schedule's length (this Trainer's "
                             f"epochs={self.epochs}), got {epochs!r}: the cosine learning rate "
                             f"would rise again past it; make a Trainer with epochs={epochs!r}")
        shape = getattr(self.model, "_shape", None)  # a built RatingModel's matrix shape
        if shape is not None and tuple(x_train.shape) != tuple(shape):
            raise ValueError(f"x_train must have the model's matrix shape {tuple(shape)}, "
                             f"got {tuple(x_train.shape)}")
        if x_train.shape[0] == 0:
            raise ValueError(f"x_train must have at least one row to train on, got shape "
                             f"{tuple(x_train.shape)}")
        values = x_train.values() if x_train.layout == torch.sparse_csr else x_train._values()
        if values.is_floating_point() and not bool(torch.isfinite(values).all()):
            raise ValueError("x_train values must be finite, got NaN or inf")  # once per fit
        run_for = self.epochs if epochs is None else int(epochs)
        dataset = SparseRowDataset(x_train)
        loader = self.make_loader(dataset)
        optimizer = self.make_optimizer()
        result, best_state = TrainResult(), None
        # each module's mode, put back if training raises (run_epoch sets train mode: a batch
        # the model refused at the first step left an evaluated model in train mode)
        modes = [(m, m.training) for m in self.model.modules()]
        try:
            return self._epochs(run_for, loader, optimizer, validate, result, best_state,
                                dataset)
        except BaseException:
            for module, training in modes:
                module.training = training
            raise

    def _epochs(self, run_for: int, loader: Any, optimizer: Any,
                validate: Optional[Callable[[], float]], result: TrainResult,
                best_state: Optional[Dict[str, Tensor]],
                dataset: SparseRowDataset) -> TrainResult:
        """The epochs of :meth:`fit`, its arguments checked (``dataset``: the training rows)."""
        for epoch in range(1, run_for + 1):
            start = time.perf_counter()
            loss = self.run_epoch(loader, optimizer, epoch)
            entry: Dict[str, float] = dict(epoch=epoch, train_loss=loss)
            # in the history (filled below) before result.best_epoch may name its epoch
            result.history.append(entry)
            if not math.isfinite(loss):  # (the epoch's loss is read anyway: no extra sync)
                self._diverged(epoch, loss, best_state is not None, result)
                entry["seconds"] = time.perf_counter() - start
                break
            if validate is not None:
                entry["valid_rmse"] = self.validation_rmse(validate)
                rmse = entry["valid_rmse"]
                # a diverged (NaN/inf) epoch is never the best one
                if math.isfinite(rmse) and (best_state is None or rmse < result.best_rmse - 1e-6):
                    result.best_epoch, result.best_rmse = epoch, entry["valid_rmse"]
                    best_state = {k: v.detach().clone()
                                  for k, v in self.model.state_dict().items()}
            entry["seconds"] = time.perf_counter() - start
            self.log(f"epoch {epoch}: train loss {loss:.4f}" + (
                f", validation RMSE {entry['valid_rmse']:.4f}" if validate else ""))
            if validate is not None and self.patience and epoch - result.best_epoch >= self.patience:
                break
        if best_state is not None:
            self.model.load_state_dict(best_state)
        else:
            result.best_epoch = len(result.history)
            self._check_ended_finite(validate is not None, result, dataset)
        return result

    def _check_ended_finite(self, validated: bool, result: TrainResult,
                            dataset: Optional[SparseRowDataset] = None) -> None:
        """``FloatingPointError`` when a run that keeps its last weights ends diverged: each
        validation RMSE NaN or infinite (the model predicts no number), or weights that are
        not finite (an epoch's loss is read before its last step, which can make them so),
        or finite weights whose loss on the first batch of ``dataset`` is not (a
        RatingModel's ``_plain_loss``: KernelNet's kernel of huge weights is NaN).  One
        host sync for the weights and that loss together."""
        epoch = len(result.history)
        hint = self._divergence_hint(epoch, f"in epoch {epoch}")
        if validated:  # (no epoch kept: every RMSE was NaN or inf)
            rmses = [str(e["valid_rmse"]) for e in result.history if "valid_rmse" in e]
            if len(rmses) > 5:  # (a long run: its first three and last, not each)
                rmses = rmses[:3] + ["...", f"{rmses[-1]}: {len(rmses)} epochs"]
            raise FloatingPointError(f"training diverged: no epoch's validation RMSE is finite "
                                     f"({', '.join(rmses)}); {hint}")
        # the parameters training changes (a frozen one may hold an inf by design: a clamp
        # bound), complex ones too (as save() checks them); one sync, whatever their devices
        weights = [_stored_values(p.detach()) for p in self.model.parameters()
                   if p.requires_grad and (p.is_floating_point() or p.is_complex())]
        flags = [torch.isfinite(w).all() for w in weights]
        loss, rows = self._last_loss(dataset)
        if loss is not None:
            flags.append(torch.isfinite(loss).all())
        if flags and not bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
            if not all(bool(f) for f in flags[:len(weights)]):
                raise FloatingPointError(f"training diverged: the weights after epoch {epoch} "
                                         f"are not finite; {hint}")
            assert loss is not None  # (the weights are finite: the loss's flag failed)
            raise FloatingPointError(f"training diverged: the weights after epoch {epoch} "
                                     f"give a training loss of {float(loss)} on the first "
                                     f"{rows} rows (the last step's weights, which no epoch's "
                                     f"loss reads); {hint}")

    def _last_loss(self, dataset: Optional[SparseRowDataset]) -> Tuple[Optional[Tensor], int]:
        """The model's loss at its current weights on the first ``batch_size`` rows of
        ``dataset`` (0-d, not read: no sync), and that number of rows; ``None`` for a model
        that cannot compute it without side effects (no ``_plain_loss``: a module of one's
        own) or without a dataset."""
        plain_loss = getattr(self.model, "_plain_loss", None)  # a RatingModel's
        if dataset is None or not callable(plain_loss) or len(dataset) == 0:
            return None, 0
        rows = min(self.batch_size, len(dataset))
        batch = dataset.collate([dataset[i] for i in range(rows)]).to(self.device)
        loss: Tensor = plain_loss(batch.row_index, batch.input)
        return loss, rows

    def _divergence_hint(self, epoch: int, when: str) -> str:
        """What a divergence error or log line advises: epoch ``epoch``'s learning rate."""
        return (f"the learning rate was {self._lr_at(epoch):.3g} {when}; a smaller lr, or "
                f"finite data and penalties, avoid it")

    def _diverged(self, epoch: int, loss: float, kept: bool, result: TrainResult) -> None:
        """Stop on a non-finite epoch loss: say so, or raise when no epoch can be kept."""
        hint = self._divergence_hint(epoch, "this epoch")
        if not kept:
            raise FloatingPointError(f"training diverged: the mean training loss of epoch "
                                     f"{epoch} is {loss}, and no earlier epoch was validated "
                                     f"to fall back on; {hint}")
        self.log(f"epoch {epoch}: train loss {loss}: training diverged and stopped; the "
                 f"weights of epoch {result.best_epoch} (the best validated) are kept; {hint}")


class _BatchLoss(torch.nn.Module):
    """``model.batch_loss`` as a module's forward, so that DDP sees the whole loss.

    DDP all-reduces the gradients of the parameters of the module it wraps,
    arming its reducer in that module's ``__call__``; the models compute
    their penalty (and KernelNet its kernels) from their parameters outside
    their own ``forward``, so the wrapped forward is the whole batch loss.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, rows: Tensor, x: Any) -> Tensor:
        loss: Tensor = getattr(self.model, "batch_loss")(rows, x)  # a RatingModel's
        return loss


class DistributedTrainer(Trainer):
    r"""The :class:`Trainer` of one process among ``torchrun``'s N, with DDP.

    The models' ``fit`` uses it instead of :class:`Trainer` whenever a
    default process group is initialised
    (:func:`nnsparse.distributed.init_from_env` under ``torchrun``); every
    rank must then call ``fit`` with the same data and hyperparameters.  A
    model with a trainer of its own (a :class:`Trainer` subclass overriding
    ``make_optimizer``, as :class:`~nnsparse.models.GLocalK`'s) gets a class of
    both: this one's DDP, that one's optimiser.

    * ``batch_size`` is the **global** batch: each process reads
      ``batch_size / world_size`` rows a step through
      :func:`nnsparse.distributed.loader` (a ``DistributedSampler`` shuffled
      with ``seed + epoch``), so a step of all ranks together reads the rows
      of one step of a one-process run with the same sampler.  (The
      one-process :class:`Trainer` shuffles with its own generator: other
      batches, the same distribution.)
    * The loss goes through :class:`nnsparse.distributed.DistributedDataParallel`
      (:func:`~nnsparse.distributed.wrap`), times ``world_size``: DDP averages
      the gradients over the ranks, so the step is the one-process step over
      the global batch.  DDP broadcasts rank 0's weights when it wraps the
      model, and the ranks then take the same steps: the weights stay equal.
    * The validation RMSE is computed on rank 0 and broadcast, so early
      stopping, the best epoch and the refit length are the same on every
      rank; the epoch's loss is averaged over the ranks; only rank 0 logs and
      shows a bar.

    Args:
        as :class:`Trainer`'s.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: ``batch_size`` is not a multiple of the number of processes.

    Example (a process group of one, as ``torchrun --nproc_per_node=1`` makes)::

        >>> import torch.distributed as dist
        >>> from nnsparse.data import synthetic_ratings
        >>> from nnsparse.models import KernelNet
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> model = KernelNet(hidden=8, epochs=2, batch_size=16, validation_ratio=0.1)
        >>> model = model.fit(synthetic_ratings(0, 60, 50, 1200), verbose=False, progress=False)
        >>> trainer = DistributedTrainer(model, epochs=2, batch_size=16, lr=1e-3)
        >>> loader = trainer.make_loader(SparseRowDataset(torch.eye(32).to_sparse_csr()))
        >>> loader.batch_size, len(loader)  # rows per process and step: 16 / 1 process
        (16, 2)
        >>> dist.destroy_process_group()
    """

    def __init__(self, model: Any, *, batch_size: int, **kwargs: Any) -> None:
        # every argument checked first (Trainer's checks set attributes only), so a
        # wrong one is named as such, with or without a process group
        super().__init__(model, batch_size=batch_size, **kwargs)
        if not nd.is_distributed():
            raise RuntimeError("DistributedTrainer needs a process group; call "
                               "nnsparse.distributed.init_from_env() under torchrun, "
                               "or use Trainer in one process")
        self.world = nd.world_size()
        if self.batch_size % self.world:
            raise ValueError(f"batch_size (the global batch) must be a multiple of the "
                             f"{self.world} processes, got {self.batch_size}")
        self._ddp: Optional[torch.nn.Module] = None

    def make_loader(self, dataset: SparseRowDataset) -> DataLoader[Any]:
        """This rank's share of the shuffled rows, ``batch_size / world_size`` a step."""
        return nd.loader(dataset, self.batch_size // self.world, seed=self.seed)

    def is_main(self) -> bool:
        return nd.is_main()

    def reduce(self, value: Tensor) -> Tensor:
        """The mean over the ranks (each rank's value is already scaled to the global batch)."""
        value = value.clone()
        torch.distributed.all_reduce(value)
        return value / self.world

    def validation_rmse(self, validate: Callable[[], float]) -> float:
        """Rank 0's validation RMSE, on every rank (the others do not compute it).

        Raises:
            as :meth:`Trainer.validation_rmse` on rank 0 (``validate``'s own error too);
            RuntimeError on the other ranks then (they waited for the value in vain).
        """
        value = torch.zeros(2, dtype=torch.float64, device=self.device)  # (rmse, failed)
        error: Optional[Exception] = None
        if self.is_main():
            try:
                value[0] = _as_rmse(validate())
            except Exception as e:  # every rank raises, not rank 0 alone (the others hung)
                error, value[1] = e, 1.0
        torch.distributed.broadcast(value, src=0)
        rmse, failed = value.tolist()
        if failed:  # (one more collective, on this path only: the error's kind, for its words)
            kind = [type(error).__name__ if error is not None else None]
            torch.distributed.broadcast_object_list(kind, src=0)
            if error is not None:
                raise error
            raise RuntimeError(f"validate() raised {kind[0]} on rank 0, which computes the "
                               f"validation RMSE: see rank 0's error")
        return cast(float, rmse)

    def step(self, batch: Any, optimizer: torch.optim.Optimizer) -> Tensor:
        _check_step_args(batch, optimizer)
        if self._ddp is None:
            raise RuntimeError("DistributedTrainer.step runs inside fit(), which wraps the "
                               "model in DistributedDataParallel first; call fit()")
        batch = batch.to(self.device)
        # times world: DDP's mean of the ranks' gradients is then their sum,
        # the gradient of the one-process loss over the global batch
        loss = _checked_loss(self._ddp(batch.row_index, batch.input)) * self.world
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        return loss.detach()

    def fit(self, x_train: Tensor, validate: Optional[Callable[[], float]] = None,
            epochs: Optional[int] = None) -> TrainResult:
        # Wrapped here: a refit builds new layers, which need a new DDP (which
        # broadcasts rank 0's weights and buffers as it wraps them).
        self._ddp = nd.wrap(_BatchLoss(self.model))
        try:
            return super().fit(x_train, validate, epochs)
        finally:
            self._ddp = None


#: the methods :class:`DistributedTrainer` replaces without calling :class:`Trainer`'s (its
#: ``__init__`` and ``fit`` call them: a trainer overriding those composes with it)
_DISTRIBUTED_OWN: Tuple[str, ...] = ("make_loader", "is_main", "reduce", "validation_rmse", "step")


def _distributed_variant(cls: Any, owner: str) -> Type[DistributedTrainer]:
    """The trainer of a run under ``torchrun`` for a model whose one-process trainer is
    ``cls`` (its ``_TRAINER``; ``owner`` names it in errors): :class:`DistributedTrainer`
    for :class:`Trainer`; for a subclass (:class:`~nnsparse.models.GLocalK`'s, whose
    ``make_optimizer`` gives the global kernel a param group without weight decay), a
    class of both, whose ``make_optimizer`` (and ``__init__``/``fit`` when they call
    ``super()``) are the subclass's, with DDP's loader, step, reduction and validation.
    ``cls`` a :class:`DistributedTrainer` already: itself.

    Raises:
        NotImplementedError: ``cls`` is no :class:`Trainer` subclass, or overrides one of
            the methods :class:`DistributedTrainer` replaces (``make_loader``, ``is_main``,
            ``reduce``, ``validation_rmse``, ``step``): which of the two should run is not
            for nnsparse to guess (a step of its own without DDP's all-reduce would leave
            the ranks' weights apart).
    """
    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        raise NotImplementedError(
            f"{owner} must be a Trainer subclass to train under torchrun (a process group "
            f"is initialised: its distributed variant derives from DistributedTrainer), got "
            f"{cls!r}")
    if cls is Trainer:
        return DistributedTrainer
    if issubclass(cls, DistributedTrainer):
        return cls
    overridden = [name for name in _DISTRIBUTED_OWN
                  if any(name in vars(k) for k in cls.__mro__[:cls.__mro__.index(Trainer)])]
    if overridden:
        raise NotImplementedError(
            f"{owner}, {cls.__qualname__}, overrides {', '.join(overridden)}, which "
            f"DistributedTrainer replaces to train under torchrun (a process group is "
            f"initialised): no distributed variant of it is made; train in one process, or "
            f"set {owner} to a subclass of both {cls.__qualname__} and DistributedTrainer "
            f"that says which runs")
    return _combined(cls)


# a model's trainer class -> its distributed variant, made once (a refit makes no new class)
_VARIANTS: Dict[type, Type[DistributedTrainer]] = {}


def _combined(cls: Type[Trainer]) -> Type[DistributedTrainer]:
    """``DistributedTrainer`` then ``cls`` (method order: DDP's methods, then ``cls``'s, then
    :class:`Trainer`'s), made once per class.  Its instances pickle as ``cls``'s do (the
    class, found by no name, is made again from ``cls`` where they are loaded)."""
    variant = _VARIANTS.get(cls)
    if variant is None:
        name = f"Distributed{cls.__name__.lstrip('_')}"

        def __reduce_ex__(self: Any, protocol: Any) -> Any:
            # (object.__getstate__ is Python 3.11's: on 3.10 the __dict__, as pickle takes it)
            getstate = getattr(self, "__getstate__", None)
            return _variant_instance, (cls,), self.__dict__ if getstate is None else getstate()

        variant = type(name, (DistributedTrainer, cls),
                       {"__module__": cls.__module__, "__qualname__": name,
                        "__reduce_ex__": __reduce_ex__,
                        "__doc__": f"{cls.__qualname__} under torchrun: DistributedTrainer's "
                                   f"DDP with {cls.__qualname__}'s own methods."})
        _VARIANTS[cls] = variant
    return variant


def _variant_instance(cls: Type[Trainer]) -> DistributedTrainer:
    """A bare instance of ``cls``'s distributed variant, its state set next (unpickling)."""
    variant = _combined(cls)
    return variant.__new__(variant)


def _stored_values(t: Tensor) -> Tensor:
    """A parameter's stored values: a sparse one's specified values (torch's ``isfinite``
    has no sparse COO kernel; a duplicate of a non-finite value sums to one)."""
    if t.layout == torch.sparse_coo:
        return t._values()
    if t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return t.values()
    return t


def _check_optimizer(optimizer: Any) -> None:
    """An optimiser by its methods (an overridden make_optimizer may return any)."""
    if not all(callable(getattr(optimizer, name, None)) for name in ("step", "zero_grad")):
        raise TypeError(f"optimizer must be an optimiser with step() and zero_grad() "
                        f"(make_optimizer), got {type(optimizer).__name__}")


def _checked_loss(loss: Any) -> Tensor:
    """``model.batch_loss``'s result, a one-element tensor that backward takes (metadata
    only, no sync): torch said "grad can be implicitly created only for scalar outputs",
    Python "'float' object has no attribute 'backward'"."""
    if not isinstance(loss, Tensor):
        raise TypeError(f"model.batch_loss must return a scalar loss tensor, got "
                        f"{type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"model.batch_loss must return a scalar loss tensor, got shape "
                         f"{tuple(loss.shape)}")
    return loss


def _check_grad_mode(call: str) -> None:
    """``RuntimeError`` when ``call`` (a training entry point) runs with autograd off:
    inside ``torch.no_grad()``, ``torch.set_grad_enabled(False)`` or
    ``torch.inference_mode()`` the loss has no graph, and torch's "element 0 of tensors
    does not require grad" came from the first backward, after the model was rebuilt."""
    if torch.is_inference_mode_enabled():
        where = "torch.inference_mode()"
    elif not torch.is_grad_enabled():
        where = "torch.no_grad() or torch.set_grad_enabled(False)"
    else:
        return
    raise RuntimeError(f"{call} trains with autograd, but gradients are off here (inside "
                       f"{where}); call it outside that block")


def _check_step_args(batch: Any, optimizer: Any) -> None:
    """What :meth:`Trainer.step` reads: a collated batch and an optimiser (the hooks of a
    subclass may call it by hand)."""
    # by what step reads: a SparseRowBatch, or a batch of an overridden make_loader's own
    if not all(hasattr(batch, name) for name in ("to", "row_index", "input")):
        raise TypeError(f"batch must be a SparseRowBatch (SparseRowDataset.collate) or "
                        f"another batch with to(), row_index and input, got "
                        f"{type(batch).__name__}")
    _check_optimizer(optimizer)
