"""What every rating autoencoder of :mod:`nnsparse.models` shares.

:class:`RatingModel` is an ``nn.Module`` that knows its data: ``fit`` builds
the layers for the rating matrix it is given, trains them with the one
:class:`~nnsparse.models.Trainer` (early stopping on a validation split, then
a refit on train + validation for the chosen number of epochs), and keeps
the training ratings, since an autoencoder predicts a row from that row's
known ratings.  Predictions for users or items absent from training come from
a mean fallback (counted), never from the network's output on an empty row.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import math
import numbers
import operator
import os
import shutil
import signal
import stat
import time
import uuid
from pathlib import Path
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, NamedTuple,
                    Optional, Protocol, Tuple, Type, Union, cast, overload)

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type
from torch.nn.utils import parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from .._forms import (_a, as_choice, as_count, as_device, as_flag, as_sparse_batch, as_tensor,
                      check_file_object, check_index_range, compile_boundary, int_dtype, is_int,
                      is_real, on_cpu_default, plain, real_float, refuse_meta, refuse_meta_device)
from .._index import coo_tensor, csr_indices, csr_tensor, csr_values
from .._load import check_state_dict
from ..data import RatingErrors, RatingNormalizer, Ratings, SparseRowDataset
from ..data.matrix import _check_same_maps
from ..data.readers import (_path, _plain, _check_ratings, _check_unique_pairs,
                            _check_unique_pairs_apart, _same)
from ..data.ranking import _checked_threshold, _relevant
from ..data.split import _concat, _draw, _torch_seed
from .. import distributed as nd
from .trainer import (Trainer, TrainResult, _check_grad_mode, _show_progress,
                      _distributed_variant)

__all__ = ["RatingModel", "Recommendations", "register", "MODELS"]

#: name -> model class, for :meth:`RatingModel.load` and the example's ``--model``.
MODELS: Dict[str, Type["RatingModel"]] = {}

_FILE_FORMAT = "nnsparse.models/1"

#: Hyperparameters every model takes, with their defaults (see RatingModel).
_COMMON: Dict[str, Any] = dict(orientation="item", epochs=100, batch_size=64, lr=1e-3,
                               min_lr_ratio=0.05, weight_decay=0.0, validation_ratio=0.05,
                               patience=20, refit=True, dense_decoder=False, seed=0)


def register(cls: Type["RatingModel"]) -> Type["RatingModel"]:
    """Class decorator: make the model loadable by name.

    Adds ``cls`` to :data:`MODELS` under ``cls.name``, the key a saved file
    holds, so :meth:`RatingModel.load` rebuilds it.

    Args:
        cls: a :class:`RatingModel` subclass that sets its own ``name``.

    Returns:
        ``cls`` itself.

    Raises:
        TypeError: ``cls`` is not a :class:`RatingModel` subclass (or is the base
            itself), or its ``name`` is not a str.
        ValueError: ``cls`` inherits its ``name`` or sets it empty, or another
            class holds that name.

    Example::

        >>> from nnsparse.models import MODELS
        >>> sorted(MODELS)
        ['autorec', 'cfn', 'glocalk', 'sparsefc']
        >>> register(MODELS["cfn"]) is MODELS["cfn"]   # registering again is harmless
        True
    """
    if not (isinstance(cls, type) and issubclass(cls, RatingModel)):
        raise TypeError(f"register takes a RatingModel subclass, got "
                        f"{cls.__name__ if isinstance(cls, type) else type(cls).__name__}")
    if cls is RatingModel:  # the abstract base: a file naming it would load no network
        raise TypeError("register takes a RatingModel subclass, got RatingModel itself")
    if "name" not in cls.__dict__:
        raise ValueError(f"{cls.__name__} must set its own name (the key load() reads), "
                         f"it inherits {cls.name!r}")
    if not isinstance(cls.name, str):  # the key a saved file holds
        raise TypeError(f"{cls.__name__}.name must be a str, got "
                        f"{type(cls.name).__name__} {cls.name!r}")
    if not cls.name:
        raise ValueError(f"{cls.__name__}.name must be a non-empty str, got ''")
    known = MODELS.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise ValueError(f"name {cls.name!r} is taken by {known.__name__}; give "
                         f"{cls.__name__} another name")
    cls._check_auto_table()
    MODELS[cls.name] = cls
    return cls


class _RecommendationFields(NamedTuple):
    """:class:`Recommendations`' fields (a ``NamedTuple`` class body cannot define the
    ``__new__`` that checks them)."""

    ids: List[Any]
    # the field shadows tuple.index (public name, kept): mypy flags the redefinition
    index: Tensor  # type: ignore[assignment]
    score: Tensor
    rating: Tensor
    support: Tensor
    titles: List[str]


class Recommendations(_RecommendationFields):
    """A user's recommended items, best first.

    Attributes:
        ids (list): the items' original ids.
        index (Tensor): int64 ``(k,)`` item indices.
        score (Tensor): ``(k,)`` the ranking score (the prediction shrunk by support).
        rating (Tensor): ``(k,)`` the predicted rating.
        support (Tensor): int64 ``(k,)`` number of training ratings of each item.
        titles (list of str): the items' titles (empty strings without titles).

    Built by hand, by ``_replace`` or loaded from a file (pickle, ``torch.load``), the
    fields are checked as :meth:`RatingModel.recommend` makes them (a named tuple's
    fields are never assigned).  No tensor data is read.

    Raises:
        TypeError: ``ids`` or ``titles`` that is not a list (``titles`` of str), a tensor
            field that is not a dense 1-D tensor of its dtype (int64 ``index`` and
            ``support``, floating ``score`` and ``rating``).
        ValueError: fields of different lengths, tensors on different devices.
    """

    __slots__ = ()

    def __new__(cls, ids: List[Any], index: Tensor, score: Tensor, rating: Tensor,
                support: Tensor, titles: List[str]) -> "Recommendations":
        _check_recommendations(ids, index, score, rating, support, titles)
        return super().__new__(cls, ids, index, score, rating, support, titles)

    # _replace's maker (tuple.__new__ there, unchecked); mypy's NamedTuple stub types it
    # over the fields' tuple, not this subclass
    @classmethod
    def _make(cls, iterable: Iterable[Any]) -> "Recommendations":  # type: ignore[override]
        return cls(*iterable)

    def __eq__(self, other: object) -> bool:
        """The same recommendations: equal ids and titles, and tensors of one dtype, device
        and shape with equal values (a tuple's ``==`` compared the tensors by their own
        elementwise ``==``: "Boolean value of Tensor with more than one value is
        ambiguous").  Equal to its copy and its reload, and, as a named tuple, to the
        plain tuple of the same values.  Unhashable, as its lists make it."""
        if not isinstance(other, tuple):
            return NotImplemented
        return len(other) == len(self) and _same(tuple(self), tuple(other))

    def __ne__(self, other: object) -> bool:  # (tuple's own != compared the tensors too)
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]


def _check_recommendations(ids: Any, index: Any, score: Any, rating: Any, support: Any,
                           titles: Any) -> None:
    """:class:`Recommendations`' fields: kinds, dtypes, one length ``k``, one device (O(1):
    no tensor data read)."""
    for name, value in (("ids", ids), ("titles", titles)):
        if not isinstance(value, list):
            raise TypeError(f"Recommendations.{name} must be a list (one per item), got "
                            f"{type(value).__name__}")
    for i, title in enumerate(titles):
        if not isinstance(title, str):
            raise TypeError(f"Recommendations.titles must be a list of str, got "
                            f"{type(title).__name__} at titles[{i}]")
    tensors = (("index", index, "int64"), ("score", score, "floating"),
               ("rating", rating, "floating"), ("support", support, "int64"))
    for name, value, kind in tensors:
        if not isinstance(value, Tensor) or value.layout != torch.strided or value.dim() != 1:
            got = (f"{value.layout} tensor of shape {tuple(value.shape)}"
                   if isinstance(value, Tensor) else type(value).__name__)
            raise TypeError(f"Recommendations.{name} must be a dense 1-D {kind} tensor (k,), "
                            f"got {got}")
        if not (value.dtype == torch.int64 if kind == "int64" else value.is_floating_point()):
            raise TypeError(f"Recommendations.{name} must be a dense 1-D {kind} tensor (k,), "
                            f"got {value.dtype}")
    lengths = {"ids": len(ids), **{name: int(value.shape[0]) for name, value, _ in tensors},
               "titles": len(titles)}
    if len(set(lengths.values())) > 1:
        raise ValueError("Recommendations fields must have one length k (one entry per item), "
                         "got " + ", ".join(f"{name} {n}" for name, n in lengths.items()))
    devices = {name: value.device for name, value, _ in tensors}
    if len(set(devices.values())) > 1:
        raise ValueError("Recommendations tensors must be on one device, got "
                         + ", ".join(f"{name} on {d}" for name, d in devices.items()))


def _as_data(ratings: Ratings) -> Ratings:
    """``ratings`` with ratings that do not require grad: data for ``fit``, not a parameter
    (a graph from them reached the model's matrix and normaliser, which deepcopy refused)."""
    if not ratings.rating.requires_grad:
        return ratings
    return dataclasses.replace(ratings, rating=ratings.rating.detach())


def _check_features(features: Optional[Tensor], rows: int, name: str) -> Optional[Tensor]:
    if features is None:
        return None
    if not isinstance(features, Tensor) or features.layout != torch.strided:
        got = (f"layout {features.layout}" if isinstance(features, Tensor)
               else type(features).__name__)
        raise TypeError(f"{name} must be a dense 2-D tensor (rows, features), got {got}")
    refuse_meta(features, name)
    if features.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor (rows, features), got shape "
                         f"{tuple(features.shape)}")
    if features.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows (one per index of the maps), "
                         f"got {features.shape[0]}")
    if features.shape[1] == 0:
        raise ValueError(f"{name} must have at least one column, got shape "
                         f"{tuple(features.shape)}")
    if features.is_complex():
        raise TypeError(f"{name} must be real, got {features.dtype}")
    # data, not a parameter: a tensor that requires grad kept its graph in the model's
    # buffer (each step's backward wrote into the caller's .grad; deepcopy refused the model)
    features = plain(features.detach().to(torch.float32))
    if not bool(torch.isfinite(features).all()):
        raise ValueError(f"{name} must be finite, got NaN or infinite values")
    return features


class _Criterion(Protocol):
    """What a model needs of :meth:`RatingModel.make_criterion`'s module."""

    def prepare_input(self, input: Any) -> Any: ...

    def __call__(self, input: Any, target: Any) -> Tensor: ...


class RatingModel(nn.Module):
    r"""Base class of the rating autoencoders: fit, predict, evaluate, rank, recommend, save, load.

    A subclass sets ``name``, ``DEFAULTS`` (its own hyperparameters),
    ``center`` and ``raw_input`` (see below), and implements :meth:`build`,
    :meth:`forward` and :meth:`penalty`.

    Common hyperparameters (keyword arguments of every model):

    * ``orientation``: ``"item"`` (rows are items, I-AutoRec) or ``"user"``;
    * ``epochs``, ``batch_size``, ``lr``, ``min_lr_ratio``: Adam with a cosine
      decay of the learning rate over ``epochs``;
    * ``weight_decay``: decoupled (AdamW-style) decay of the parameters of two
      or more dimensions (the weight matrices, :class:`KernelNet`'s kernel
      embeddings ``u`` and ``v``; not :class:`GLocalK`'s ``conv_kernel``),
      never of the biases, on top of the paper's penalty; default 0, since
      the papers' penalty (``l2``) already regularises;
    * ``dense_decoder``: train with the decoder's dense output read at the
      target's ratings instead of the sampled product (same numbers, slower;
      a check of the sparse path);
    * ``validation_ratio``: share of the training ratings held out to choose
      the number of epochs (0: train ``epochs`` epochs, no early stopping);
    * ``patience``: stop after that many epochs without a better validation RMSE;
    * ``refit``: retrain on train + validation for the chosen number of epochs;
    * ``seed``: initialisation, shuffling, corruption and the validation draw.

    The objective is the paper's full-data one, ``sum of squared errors on the
    rating scale + penalty``; a batch carries its share of the penalty
    (``batch rows / rows``), so the penalty's weight relative to the data term
    is the same whatever the batch size, and falls as the data grows.

    A hyperparameter named in the class's ``AUTO`` may be ``"auto"``: ``fit``
    then sets it from the number ``n`` of ratings it is given (``train``, and
    ``validation`` when one is passed: the refit trains on both), as
    ``AUTO[key] * (n / AUTO_RATINGS) ** AUTO_EXPONENT`` (the value at
    MovieLens-100K's 80,000 training ratings, grown with the data);
    :meth:`effective_hparams` gives the values training uses.  ``AUTO`` names
    penalty weights only (``l2``, ``l2_kernel``: :func:`register` and the
    constructor refuse a class listing another), and every other
    hyperparameter nnsparse checks (the common ones above, sizes, rates,
    penalties) refuses ``"auto"`` (a numpy str too), at construction and
    wherever ``hparams`` edited since are checked again (:meth:`fit`,
    :meth:`save`); a subclass's own hyperparameter may take any value a
    model file holds, ``"auto"`` included.
    """

    name = "base"
    DEFAULTS: Dict[str, Any] = {}
    # the trainer of fit's runs (a model may need its own optimiser groups); under torchrun
    # its DistributedTrainer variant (trainer._distributed_variant: make_optimizer kept)
    _TRAINER: Type[Trainer] = Trainer
    #: hyperparameters that may be ``"auto"``: their value at ``AUTO_RATINGS`` ratings
    AUTO: Dict[str, float] = {}
    #: the training ratings at which an ``"auto"`` hyperparameter is ``AUTO[key]``
    #: (MovieLens-100K's u1.base .. u5.base)
    AUTO_RATINGS = 80_000
    #: how an ``"auto"`` hyperparameter grows with the training ratings
    AUTO_EXPONENT = 0.4
    #: whether the normaliser subtracts row means
    center = False
    #: whether the network reads and predicts raw ratings (``lo..hi``) rather
    #: than the normalised ``[-1, 1]`` values; a missing rating is then 0,
    #: below every star, as in AutoRec
    raw_input = True

    def __init__(self, *args: Any, **hparams: Any) -> None:
        type(self)._check_auto_table()  # (a subclass used unregistered: register checks it too)
        known = {**_COMMON, **self.DEFAULTS}
        if args:  # Python's own message names __init__'s positional count only
            raise TypeError(f"{type(self).__name__} takes its hyperparameters as keywords "
                            f"(hidden=...), got {len(args)} positional argument(s) {args!r}; "
                            f"it takes {sorted(known)}")
        super().__init__()
        unknown = sorted(set(hparams) - set(known))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown hyperparameters {unknown}; "
                            f"it takes {sorted(known)}")
        self.hparams: Dict[str, Any] = {**known, **hparams}
        self._check_hparams()
        self.normalizer: Optional[RatingNormalizer] = None
        self.history: List[Dict[str, float]] = []
        self.best_epoch: int = 0
        self.fit_seconds: float = 0.0
        self.verbose = True
        self._built = False
        self._unfit_reason: Optional[str] = None  # why a fitted model is no longer (fit)
        self._user_lookup: Optional[Dict[Any, int]] = None  # original id -> index, built on use

    # -- hyperparameters ----------------------------------------------------------
    @classmethod
    def _check_auto_table(cls) -> None:
        """``ValueError`` unless ``AUTO`` names only the class's own penalty hyperparameters
        (``l2``, ``l2_kernel``, ...) with positive values, and the growth rule is a number:
        an ``"auto"`` learning rate or size would reach the Trainer or ``build`` as a str."""
        where = f"{cls.__name__}.AUTO"
        if not isinstance(cls.AUTO, dict):
            raise TypeError(f"{where} must be a dict (penalty hyperparameter -> its value at "
                            f"AUTO_RATINGS ratings), got {type(cls.AUTO).__name__}")
        for key, value in cls.AUTO.items():
            if not (isinstance(key, str) and key in cls.DEFAULTS and _is_penalty(key)):
                raise ValueError(f"{where} may name only {cls.__name__}'s own penalty "
                                 f"hyperparameters (DEFAULTS keys starting with 'l2'), got "
                                 f"{key!r}")
            if not is_real(value) or not 0 < real_float(value) < math.inf:  # (nor a timedelta64)
                raise ValueError(f"{where}[{key!r}] must be a positive finite number, got "
                                 f"{value!r}")
        n, e = cls.AUTO_RATINGS, cls.AUTO_EXPONENT
        if not is_int(n) or n < 1:  # (not a bool, nor a numpy timedelta64)
            raise ValueError(f"{cls.__name__}.AUTO_RATINGS must be an int >= 1, got {n!r}")
        if not is_real(e) or not math.isfinite(real_float(e)):  # (nor a np.timedelta64)
            raise ValueError(f"{cls.__name__}.AUTO_EXPONENT must be a finite number, "
                             f"got {e!r}")

    def _refuse_auto(self, key: str) -> TypeError:
        """The error of an ``"auto"`` given to ``key``, which is not in ``AUTO``."""
        name = type(self).__name__
        if self.AUTO:
            takes = (f"{name} takes 'auto' only for its penalties "
                     f"{', '.join(sorted(self.AUTO))}, which fit sets from the number of "
                     f"training ratings")
        else:
            others = "; ".join(f"{c.__name__}'s {', '.join(sorted(c.AUTO))}"
                               for c in MODELS.values() if c.AUTO)
            takes = (f"{name} takes 'auto' for none of its hyperparameters ('auto' is for "
                     f"penalties that fit sets from the number of training ratings"
                     + (f", such as {others}" if others else "") + ")")
        return TypeError(f"{key} cannot be 'auto': {takes}; give {key} a value")

    def _check_hparams(self) -> None:
        """Check ``self.hparams`` and normalise it in place (numpy scalars as Python ones);
        a refused dict is left as it was."""
        checked = self._checked_hparams()
        self.hparams.update(checked)

    def _checked_hparams(self) -> Dict[str, Any]:
        """``self.hparams`` checked, as a new dict of plain Python values (what a model file
        holds and ``torch.load(weights_only=True)`` reads); ``self`` is not changed.

        Raises:
            TypeError: hparams not a dict; unknown or missing keys; a value of the wrong
                kind, ``"auto"`` among them for a key not in ``AUTO``.
            ValueError: a value out of its range, or not finite.
        """
        if not isinstance(self.hparams, dict):
            raise TypeError(f"{type(self).__name__}.hparams must be a dict of hyperparameters, "
                            f"got {type(self.hparams).__name__}")
        h = dict(self.hparams)
        known = {**_COMMON, **self.DEFAULTS}
        unknown = sorted(set(h) - set(known), key=str)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown hyperparameters {unknown}; "
                            f"it takes {sorted(known)}")
        missing = sorted(set(known) - set(h))
        if missing:  # a key deleted from model.hparams: fit would fail on a KeyError
            raise TypeError(f"{type(self).__name__}.hparams lacks {missing}; every "
                            f"hyperparameter needs a value (defaults: "
                            f"{ {k: known[k] for k in missing} })")
        # a str, not a numpy str: save() pickles it
        h["orientation"] = as_choice(_plain(h["orientation"]), "orientation", ("item", "user"),
                                     "'item' or 'user'")
        for key, value in h.items():  # before the checks of kinds, whose words omit it
            # (a subclass's own hyperparameter, which no check here reads, may mean "auto")
            if _is_auto(value) and key not in self.AUTO and _is_checked(key):
                raise self._refuse_auto(key)
        for key in ("epochs", "batch_size"):
            h[key] = as_count(key, h[key], 1)
        h["patience"] = as_count("patience", h["patience"], 0)
        if not is_int(h["seed"]):  # (not a numpy timedelta64, which numbers.Integral takes)
            raise TypeError(f"seed must be an int, got {type(h['seed']).__name__}")
        h["seed"] = int(h["seed"])  # a numpy int too; any size (see _torch_seed)
        for key in ("refit", "dense_decoder"):
            h[key] = as_flag(h[key], key)  # saved as a bool: a numpy bool passes
        for key, value in h.items():
            if _is_auto(value):  # in AUTO, or a subclass's own (checked above)
                h[key] = "auto"  # not a numpy str: save() pickles it; fit() sets the value
                continue
            if key in ("lr", "weight_decay", "validation_ratio", "min_lr_ratio") or \
                    _is_penalty(key) or key in ("alpha", "beta", "hide_ratio"):
                _check_number(key, value, " or 'auto'" if key in self.AUTO else "")
                # (an int from 2**1024, or such a Fraction: inf, not float()'s OverflowError)
                number = real_float(value)
                if not math.isfinite(number) and not math.isnan(number):  # NaN: range checks
                    raise ValueError(f"{key} must be finite, got {value!r}")
                # a numpy float would be pickled as one: save()'s file, read with
                # weights_only=True, could not be loaded
                h[key] = number
        if not h["lr"] > 0:
            raise ValueError(f"lr must be positive, got {h['lr']!r}")
        if not h["weight_decay"] >= 0:
            raise ValueError(f"weight_decay must be non-negative, got {h['weight_decay']!r}")
        if not 0 <= h["validation_ratio"] < 1:
            raise ValueError(f"validation_ratio must be in [0, 1), got {h['validation_ratio']!r}")
        if not 0 <= h["min_lr_ratio"] <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {h['min_lr_ratio']!r}")
        for key, value in h.items():
            if key in ("hidden", "layers", "dim"):
                h[key] = as_count(key, value, 1)
            if (_is_penalty(key) or key in ("alpha", "beta")) and not _is_auto(value) \
                    and not value >= 0:
                raise ValueError(f"{key} must be non-negative, got {value!r}")
            if key in ("alpha", "beta") and value > _FLOAT32_MAX:  # the loss weights: float32
                raise ValueError(f"{key} must be at most {_FLOAT32_MAX} (the loss is float32), "
                                 f"got {value!r}")
            if key == "hide_ratio" and not 0 <= value < 1:
                raise ValueError(f"hide_ratio must be in [0, 1), got {value!r}")
        # a subclass's own hyperparameters: its checks (a count takes a 0-d integer tensor, as
        # the counts above do), then plain values, as what no check knows
        self._check_own_hparams(h)
        return {key: _plain_hparam(key, value) for key, value in h.items()}

    def _check_own_hparams(self, h: Dict[str, Any]) -> None:
        """Check and normalise a subclass's own hyperparameters in ``h`` (a copy of
        ``self.hparams``, the common ones checked), in place; raise as
        :meth:`_checked_hparams` does.  Each value left must be a plain one a model file
        holds (or one ``_plain_hparam`` makes plain).  The base has none."""

    def effective_hparams(self) -> Dict[str, Any]:
        """The hyperparameters training uses: ``hparams`` with each ``"auto"`` set.

        An ``"auto"`` value (see ``AUTO``) is set from the number of ratings
        the last :meth:`fit` was given, a ``validation`` set included (or the
        loaded model's); before any fit it stays ``"auto"``.

        Example::

            >>> from nnsparse.data import synthetic_ratings
            >>> from nnsparse.models import KernelNet
            >>> model = KernelNet(hidden=4, epochs=1, validation_ratio=0.0)
            >>> model.effective_hparams()["l2"]
            'auto'
            >>> r = synthetic_ratings(0, 60, 50, 1200)
            >>> l2 = model.fit(r, verbose=False, progress=False).effective_hparams()["l2"]
            >>> l2 == 20.0 * (1200 / 80_000) ** 0.4     # KernelNet.AUTO["l2"] at 1,200 ratings
            True
        """
        out = dict(self.hparams)
        n = getattr(self, "penalty_ratings", None)
        for key, value in out.items():
            if _is_auto(value) and key in self.AUTO and n is not None:
                out[key] = self.AUTO[key] * (n / self.AUTO_RATINGS) ** self.AUTO_EXPONENT
        return out

    def extra_repr(self) -> str:
        """The model's own hyperparameters, then the training ones set away from their
        defaults (``AutoRec(hidden=8, epochs=2)`` printed as ``AutoRec(hidden=8, l2=200.0)``
        before: a logged configuration without the epochs, rate or batch size it ran with)."""
        # never raises (a repr runs in tracebacks and debuggers): a model half built (a
        # subclass's __init__ before RatingModel's), hparams replaced by something else, or
        # edited to a value whose != is no bool (an array) or whose repr fails (an int past
        # Python's 4,300 digits) shows what it can
        hparams = getattr(self, "hparams", None)
        defaults = self.DEFAULTS if isinstance(self.DEFAULTS, dict) else {}
        if not isinstance(hparams, dict):
            return ""
        own = {k: v for k, v in hparams.items() if k in defaults}
        own.update({k: v for k, v in hparams.items()
                    if k not in defaults and k in _COMMON and _differs(v, _COMMON[k])})
        return ", ".join(f"{k}={_brief(v)}" for k, v in own.items())

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> "_IncompatibleKeys":
        """``nn.Module.load_state_dict``, checked whole first: a refused load changes nothing.

        Raises:
            RuntimeError: torch's errors (keys, shapes), before anything is copied; a
                non-empty state for a model never fitted (``fit`` makes its layers).
            ValueError: an entry that is not finite (NaN or inf weights of a diverged
                model, which :meth:`save` and :meth:`load` refuse too); nothing is copied.
        """
        if (not self._built and isinstance(state_dict, Mapping) and len(state_dict)
                and not self.state_dict()):
            # (torch's message listed every key as unexpected, without the reason)
            raise RuntimeError(f"{type(self).__name__} is not fitted, so it has no layers to "
                               f"load weights into (fit() builds them for its data's shape); "
                               f"load a saved model with {type(self).__name__}.load(path), or "
                               f"fit it first (nothing was loaded)")
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        # as save() and load() refuse them: a diverged state (or NaN side features, which
        # fit refuses) predicted NaN for every known entry, silently
        own = self.state_dict()
        bad = [k for k, v in state_dict.items() if k in own and isinstance(v, Tensor)
               and (v.is_floating_point() or v.is_complex()) and v.device.type != "meta"
               and not bool(torch.isfinite(v).all())]
        if bad:
            raise ValueError(f"state_dict holds values that are not finite (NaN or inf) in "
                             f"{bad}: the model it was taken from had diverged (save() and "
                             f"load() refuse such weights); nothing was loaded")
        return cast(_IncompatibleKeys,
                    super().load_state_dict(state_dict, strict=strict, assign=assign))

    def __getstate__(self) -> Dict[str, Any]:
        # torch cannot deep-copy a CSR tensor ("Cannot access storage of
        # SparseCsrTensorImpl"): the training matrix travels as its index and value
        # tensors, so copy.deepcopy(model) works (a snapshot of the best model)
        state: Dict[str, Any] = super().__getstate__()  # type: ignore[no-untyped-call]
        x = state.get("_input")
        if isinstance(x, Tensor) and x.layout == torch.sparse_csr:
            state["_input"] = _CsrParts(*csr_indices(x), csr_values(x), tuple(x.shape))
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        x = self.__dict__.get("_input")
        if isinstance(x, _CsrParts):
            # checked, not trusted: torch.load(weights_only=True) allows _CsrParts, so a
            # file's parts may hold a column beyond the width (predict's trusted batches
            # handed it to the kernels unchecked); one check, as for a user's matrix
            matrix = csr_tensor(x.crow, x.col, x.values, x.size)
            as_sparse_batch(matrix, name="a saved model's training matrix", pairs=False)
            self._input = matrix
        if self.__dict__.get("_built") is True:
            _check_fitted_state(self)

    # -- what a subclass implements ------------------------------------------------
    def build(self, rows: int, width: int, features: int) -> None:
        """Create the layers for ``rows`` x ``width`` matrices with ``features`` side features."""
        raise NotImplementedError(f"{type(self).__name__} must implement build()")

    def penalty(self) -> Tensor:
        """The weight penalty of the full-data objective (weights only, never biases)."""
        raise NotImplementedError(f"{type(self).__name__} must implement penalty()")

    def network(self, x: Any, rows: Tensor, pattern: Any = None) -> Any:
        """The network on model-scale values (raw or normalised), sampled at ``pattern``."""
        raise NotImplementedError(f"{type(self).__name__} must implement network()")

    def output_bias(self) -> Optional[Tensor]:
        """The output layer's bias, started at the mean rating for raw-input models."""
        return None

    def make_criterion(self) -> nn.Module:
        """The data term: squared error summed over the target's ratings."""
        from ..criteria import SparseCriterion
        return SparseCriterion(nn.MSELoss(), size_average=False)

    @property
    def _norm(self) -> RatingNormalizer:
        """The normaliser, set by ``_prepare`` (fit or load) before any use."""
        norm = self.normalizer
        assert norm is not None, "the model is not prepared (fit or load)"
        return norm

    # -- scale handling: the network sees raw ratings or the normalised values ----------
    def _to_model(self, values: Tensor) -> Tensor:
        if not self.raw_input:
            return values
        lo, hi = self._norm.scale
        return lo + (values + 1.0) * ((hi - lo) / 2.0)

    def _from_model(self, values: Tensor) -> Tensor:
        if not self.raw_input:
            return values
        lo, hi = self._norm.scale
        return (values - lo) * (2.0 / (hi - lo)) - 1.0

    @compile_boundary
    def forward(self, x: Any, rows: Tensor, pattern: Any = None) -> Any:
        """Normalised predictions for the rows ``rows`` from their normalised inputs ``x``.

        Returns a sparse tensor with ``pattern``'s positions, or dense
        ``(batch, width)`` without a pattern.

        Raises:
            TypeError: ``rows`` is not an integer tensor.
            ValueError: ``rows`` is not one matrix row per row of ``x``, is on
                the meta device, or (on the CPU) is outside ``[0, rows)``.
        """
        from .. import values_map
        self._check_built()
        _check_rows(rows, x, self._shape[0])
        out = self.network(values_map(self._to_model, x), rows, pattern)
        return values_map(self._from_model, out) if pattern is not None else self._from_model(out)

    def _row_features(self, rows: Tensor) -> Optional[Tensor]:
        feats = getattr(self, "row_features", None)
        return None if feats is None else feats[rows]

    # -- training -------------------------------------------------------------------
    def batch_loss(self, rows: Tensor, x: Any) -> Tensor:
        """The training loss of one batch of rows ``x`` (normalised sparse, the target too)."""
        self._check_built()
        return self._loss(rows, self._criterion.prepare_input(x), x, self._criterion)

    def _loss(self, rows: Tensor, input: Any, x: Any, criterion: Callable[..., Tensor]) -> Tensor:
        """:meth:`batch_loss` of the (prepared) ``input`` against ``x`` with ``criterion``."""
        out = self(input, rows, pattern=None if self.hparams["dense_decoder"] else x)
        # Squared errors on the rating scale: the normalised error times (hi - lo) / 2.
        lo, hi = self._norm.scale
        data = criterion(out, x) * ((hi - lo) / 2.0) ** 2
        share = rows.shape[0] / self._shape[0]
        loss: Tensor = (data + share * self.penalty()) / self._per_batch
        return loss

    def _plain_loss(self, rows: Tensor, x: Any) -> Tensor:
        """:meth:`batch_loss` without the criterion's corruption or weights (the squared
        errors summed, as :meth:`RatingModel.make_criterion`'s), under ``no_grad`` and in
        eval mode, as :meth:`predict` runs the network (each module's mode put back): it
        draws no random number (a subclass's dropout), updates no running statistics (its
        batch norm) and keeps no mask.  Read by :class:`Trainer`'s end-of-run check
        without validation: the loss of the last weights, which no epoch's loss reads
        (finite weights can give NaN outputs: KernelNet's kernel of huge ones)."""
        self._check_built()
        modes = [(m, m.training) for m in self.modules()]
        self.eval()
        try:
            with torch.no_grad():
                return self._loss(rows, x, x, RatingModel.make_criterion(self))
        finally:
            for module, training in modes:
                module.training = training

    def _prepare(self, train: Ratings, scale: Tuple[float, float],
                 features: Optional[Tensor], penalty_ratings: Optional[int] = None) -> Tensor:
        """Normaliser, statistics and fresh layers for ``train``; the training matrix.

        ``penalty_ratings`` (default ``len(train)``) sets the ``"auto"``
        hyperparameters: ``fit`` passes the ratings it was given (train, and
        validation when passed), so the run on train less validation and the
        refit on all of it use the same values.
        """
        h = self.hparams
        self.penalty_ratings = int(len(train) if penalty_ratings is None else penalty_ratings)
        torch.manual_seed(_torch_seed(h["seed"]))
        self.normalizer = RatingNormalizer(train, h["orientation"], center=self.center,
                                           scale=scale)
        rows, width = self.normalizer.shape
        self._shape = (rows, width)
        self._per_batch: float = max(len(train) * min(h["batch_size"], rows) / rows, 1.0)
        self._set_statistics(train)
        # in float32, the rating matrix's dtype, whatever torch's default: layers built under
        # torch.set_default_dtype(torch.float64) refused the matrix at the first step
        # ("input must have the weight's dtype").  The models' own builds pass
        # dtype=torch.float32 (the seeded initial weights are the same under any default);
        # what a subclass's build made in another default dtype is converted after.  (Not
        # by setting torch's default dtype around build: it is the process's, and another
        # thread would make its tensors in float32 meanwhile.)
        default = torch.get_default_dtype()
        before = None if default == torch.float32 else _state_of(self)
        self.build(rows, width, 0 if features is None else features.shape[1])
        if before is not None:
            _made_float32(self, before, default)
        bias = self.output_bias()
        if bias is not None and self.raw_input:
            # An output of 0 is 3.5 stars below the data: start at the mean
            # rating, so the first epochs learn structure, not the offset.
            with torch.no_grad():
                bias.fill_(self.global_mean)
        if features is not None:
            self.register_buffer("row_features", features.clone())
        self._built = True
        self._unfit_reason = None
        # what build() read: save() names the ones edited since (_check_network_hparams)
        self._fit_hparams = dict(h)
        # a criterion module with prepare_input (SparseCriterion, SDAESparseCriterion, ...)
        self._criterion = cast(_Criterion, self.make_criterion())
        x = self.normalizer.matrix(train)
        self._input = x
        return x

    def _set_statistics(self, train: Ratings) -> None:
        """Means and counts for the fallback and the support filter (raw ratings)."""
        n_users, n_items = train.n_users, train.n_items
        r = train.rating.to(torch.float32)
        self.user_count = torch.bincount(train.user, minlength=n_users)
        self.item_count = torch.bincount(train.item, minlength=n_items)
        self.global_mean = float(r.mean())
        # Means shrunk towards the global mean by a few pseudo-ratings, so a
        # user or item with one rating does not get that rating as its mean.
        k = 3.0
        def shrunk(index: Tensor, count: Tensor, n: int) -> Tensor:
            sums = r.new_zeros(n).index_add_(0, index, r)
            return (sums + k * self.global_mean) / (count.to(r.dtype) + k)
        self.user_mean = shrunk(train.user, self.user_count, n_users)
        self.item_mean = shrunk(train.item, self.item_count, n_items)
        self.user_ids_: List[Any] = train.user_ids()
        self.item_ids_: List[Any] = train.item_ids()
        self.titles_: Optional[List[str]] = list(train.titles) if train.titles else None
        self._train = train
        self._user_lookup = None  # the ids may have changed: rebuilt on the next use

    def _trainer(self, device: torch.device, progress: Optional[bool],
                 epochs: Optional[int] = None, lr: Optional[float] = None) -> Trainer:
        """The trainer of a run: ``epochs`` and ``lr`` (default: the hparams') set its
        schedule (a stage of its own, :class:`GLocalK`'s fine-tuning, gives its own)."""
        h = self.hparams
        # under torchrun (a process group initialised): DDP, batch_size the global batch,
        # with the model's own trainer's make_optimizer (GLocalK's param groups)
        cls = (_distributed_variant(self._TRAINER, f"{type(self).__name__}._TRAINER")
               if nd.is_distributed() else self._TRAINER)
        return cls(self, epochs=h["epochs"] if epochs is None else epochs,
                   batch_size=h["batch_size"], lr=h["lr"] if lr is None else lr,
                   min_lr_ratio=h["min_lr_ratio"], weight_decay=h["weight_decay"],
                   patience=h["patience"],
                   device=device, seed=h["seed"], progress=progress,
                   log=print if self.verbose else None)

    def _train_run(self, device: torch.device, progress: Optional[bool],
                   validate: Optional[Callable[[], float]],
                   first: Optional[TrainResult] = None) -> TrainResult:
        """One training run of :meth:`fit` on ``self._input``: early-stopped on ``validate``,
        or, for the refit (``first`` the early-stopped run's result), as many epochs as
        ``first`` kept.  A model trained in stages (:class:`GLocalK`) runs each here."""
        epochs = None if first is None else first.best_epoch
        return self._trainer(device, progress).fit(self._input.to(device), validate,
                                                   epochs=epochs)

    @on_cpu_default
    def fit(self, train: Ratings, validation: Optional[Ratings] = None, *,
            features: Optional[Tensor] = None, device: Union[str, torch.device] = "cpu",
            progress: Optional[bool] = None, verbose: bool = True) -> "RatingModel":
        r"""Train on ``train``; choose the number of epochs on ``validation``; refit.

        Args:
            train (Ratings): the training ratings.  Its id maps fix the matrix
                shape; indices without training ratings get the mean fallback.
            validation (Ratings, optional): ratings sharing ``train``'s maps
                for early stopping.  Default: ``validation_ratio`` of ``train``
                drawn with ``seed``.  With ``refit`` the final model is trained
                on ``train + validation`` for the best epoch count.
            features (Tensor, optional): float ``(rows, f)`` side features of
                the matrix rows (item features for ``orientation="item"``, user
                features for ``"user"``), for models that read them (CFN++).
            device: where to train.  Default: the CPU, whatever torch's default
                device (``torch.set_default_device("cuda")`` or ``with
                torch.device("cuda")`` do not move training: pass
                ``device="cuda"``); inside, tensors made without a ``device``
                are made on the CPU.
            progress (bool, optional): tqdm bars; default: only on a terminal.
            verbose (bool): print one line per epoch.

        Under ``torchrun`` (a default process group initialised, e.g. by
        :func:`nnsparse.distributed.init_from_env`) every rank calls ``fit``
        with the same arguments and trains with
        :class:`~nnsparse.models.DistributedTrainer`: ``batch_size`` is the
        global batch, split over the processes; DDP averages the gradients;
        early stopping follows rank 0's validation RMSE on every rank, and so
        does the refit; the weights end equal on every rank; only rank 0 prints.
        A model class with a trainer of its own (``_TRAINER``, a :class:`Trainer`
        subclass: its optimiser's param groups) trains with a class of both,
        the subclass's ``make_optimizer`` kept.

        Returns:
            ``self``, trained, in eval mode, on ``device``; in float32 (the ratings' dtype)
            whatever ``torch.get_default_dtype()`` is (convert it after: ``model.double()``).

        Raises:
            TypeError: ``train`` or ``validation`` not a :class:`Ratings`;
                ``features`` not a tensor; ``progress``/``verbose`` not bools.
            ValueError: empty ``train``, or every rating equal; ``validation``
                with other id maps; a (user, item) pair rated more than once
                in ``train``, or in ``train`` and ``validation`` together;
                ``features`` not ``(rows, f >= 1)`` or not finite, or given to a
                model that reads none (``AutoRec``, ``KernelNet``); an unknown
                ``device``.
            FloatingPointError: training diverged before any validated epoch, or
                ended with no finite validation RMSE, or (without validation) with
                weights, or a training loss at them, that are not finite
                (:meth:`Trainer.fit`; e.g. too large an ``lr``).
            RuntimeError: called with autograd off (inside ``torch.no_grad()``,
                ``torch.set_grad_enabled(False)`` or ``torch.inference_mode()``).
            NotImplementedError: under ``torchrun``, a model class whose trainer of its own
                (``_TRAINER``) overrides a method :class:`DistributedTrainer` replaces
                (``make_loader``, ``is_main``, ``reduce``, ``validation_rmse``, ``step``).
            A refused call leaves the model as it was.  A call that fails once
            training started (a divergence, any exception but an interrupt)
            leaves the model not fitted: ``predict`` and ``save`` refuse its
            weights until a ``fit`` succeeds, and ``history`` is empty.
        """
        _check_ratings(train, "train")
        _check_grad_mode(f"{type(self).__name__}.fit")
        train = _as_data(train)
        self._check_hparams()  # again: model.hparams may have been edited since __init__
        if validation is not None:
            _check_ratings(validation, "validation")
            validation = _as_data(validation)
            if len(validation) == 0:
                raise ValueError("validation holds no ratings; pass None to hold out "
                                 "validation_ratio of train instead")
        if len(train) == 0:
            raise ValueError("train holds no ratings")
        if progress is not None:
            progress = as_flag(progress, "progress", "None or a bool")
        verbose = as_flag(verbose, "verbose")
        h, device = self.hparams, _as_device(device)
        rows = train.n_items if h["orientation"] == "item" else train.n_users
        features = _check_features(features, rows, "features")
        if features is not None and not getattr(self, "uses_features", False):
            raise ValueError(f"{type(self).__name__} reads no side features; use CFN (CFN++)")
        if validation is not None and (validation.user_map is not train.user_map
                                       or validation.item_map is not train.item_map):
            raise ValueError("validation must share train's id maps (split it from train)")
        # Before training, not at the refit's matrix: a pair rated twice would
        # otherwise train a whole run, leak into validation, and only then fail.
        if validation is None:
            _check_unique_pairs("train", train)
        else:
            _check_unique_pairs_apart("train", train, "train and validation together",
                                      validation)
        # the ratings fit is given, validation included: what "auto" values are set for, the
        # same whether validation is passed or drawn from train (the refit trains on both)
        given = len(train) + (0 if validation is None else len(validation))
        if validation is None and h["validation_ratio"] > 0:
            train_part, validation = _draw(train, h["validation_ratio"], h["seed"])
        else:
            train_part = train
        if len(train_part) == 0:
            raise ValueError(f"train: no ratings are left for training once validation is "
                             f"held out (train has {len(train)}, validation "
                             f"{len(validation) if validation is not None else 0}); give more "
                             f"ratings or validation_ratio=0")
        scale = train.scale if validation is None or len(validation) == 0 else (
            min(train.scale[0], validation.scale[0]), max(train.scale[1], validation.scale[1]))
        if not scale[0] < scale[1]:
            raise ValueError(f"train: every rating is {scale[0]}; the model learns on the "
                             f"scale (min, max) of the ratings, which needs two distinct values")
        if nd.is_distributed():  # (its refusal before the model changes)
            _distributed_variant(self._TRAINER, f"{type(self).__name__}._TRAINER")
        self.verbose = verbose  # every check passed: the model changes from here
        start = time.perf_counter()
        try:
            self._prepare(train_part, scale, features, given)
            auto = {k: v for k, v in self.effective_hparams().items() if _is_auto(h[k])}
            if auto and verbose and nd.is_main():
                print(", ".join(f"{k} {v:.4g}" for k, v in auto.items())
                      + f" ('auto': set for {given:,} training ratings)")
            self.to(device)
            validate = None
            if validation is not None and len(validation):
                validate = lambda: self.evaluate(validation)["rmse"]  # noqa: E731
            result = self._train_run(device, progress, validate)
            self.history, self.best_epoch = result.history, result.best_epoch
            if validate is not None and h["refit"]:
                if verbose and nd.is_main():
                    print(f"refit on train + validation for {result.best_epoch} epochs "
                          f"(best validation RMSE {result.best_rmse:.4f})")
                assert validation is not None  # validate is set only with a validation set
                # checked above: train and validation together rate no pair twice
                self._prepare(_concat(train_part, validation, unique=True), scale, features,
                              given)
                self.to(device)
                self._train_run(device, progress, None, result)
        except Exception as e:
            # the layers hold a failed run's weights (NaN after a divergence): predict
            # and save refuse them until a fit succeeds.  (An interrupt keeps them.)
            self._built = False
            self._unfit_reason = f"its last fit() raised {type(e).__name__}"
            self.history, self.best_epoch = [], 0  # (an earlier fit's, whose weights are gone)
            raise
        self.fit_seconds = time.perf_counter() - start
        self.eval()
        return self

    # -- prediction -------------------------------------------------------------------
    def _check_built(self) -> None:
        if not self._built:
            why = getattr(self, "_unfit_reason", None)
            raise RuntimeError(f"{type(self).__name__} is not fitted"
                               + (f" ({why})" if why else "") + "; call fit() or load()")

    def _check_layers(self, name: str) -> None:
        """The layers :meth:`build` makes exist (``fit`` calls :meth:`output_bias` between
        ``build`` and the end of its preparation): else the state error of
        :meth:`_check_built`, not Python's ``AttributeError`` of a missing layer."""
        if name not in self._modules:
            self._check_built()
            raise RuntimeError(f"{type(self).__name__}.build() made no {name!r} layer")

    def _check_data(self) -> None:
        """``ValueError`` for a fitted model moved to the meta device (``model.to("meta")``):
        its weights hold no numbers to predict with or save (torch failed deep inside, on
        a batch tensor the caller never passed, or with "Cannot copy out of meta tensor")."""
        if self.device.type == "meta":
            raise ValueError(f"{type(self).__name__}'s parameters must hold data, got them on "
                             f"the meta device (after .to('meta')); load weights into a model "
                             f"on a real device, e.g. {type(self).__name__}.load(path)")

    @property
    def device(self) -> torch.device:
        self._check_built()
        return next(self.parameters()).device

    def _known(self, users: Tensor, items: Tensor) -> Tuple[Tensor, Tensor]:
        """Entries whose user and item both have training ratings."""
        u_ok = users < self.user_count.shape[0]
        i_ok = items < self.item_count.shape[0]
        u_ok = u_ok & (self.user_count[users.clamp(max=self.user_count.shape[0] - 1)] > 0)
        i_ok = i_ok & (self.item_count[items.clamp(max=self.item_count.shape[0] - 1)] > 0)
        return u_ok, i_ok

    @on_cpu_default
    def fallback(self, users: Tensor, items: Tensor) -> Tuple[Tensor, Dict[str, int]]:
        """Mean predictions and which entries need them.

        Returns ``(prediction, counts)``: the item mean where only the item
        is known, the user mean where only the user is, the global mean where
        neither is; ``counts`` says how many entries took each.
        """
        self._check_built()
        users, items = _index_tensor(users, "users"), _index_tensor(items, "items")
        if users.shape != items.shape:
            raise ValueError(f"users and items must have one shape, got {tuple(users.shape)} "
                             f"and {tuple(items.shape)}")
        _check_non_negative(users, items)  # -1 read the last user's mean and counted as known
        pred, counts, _ = self._means(users, items)
        return pred, counts

    def _means(self, users: Tensor, items: Tensor) -> Tuple[Tensor, Dict[str, int], Tensor]:
        """:meth:`fallback`'s means and counts of checked indices, and which entries have
        both a known user and a known item (the network predicts those)."""
        u_ok, i_ok = self._known(users, items)
        pred = torch.full(users.shape, self.global_mean, dtype=torch.float32)
        pred = torch.where(u_ok & ~i_ok, self.user_mean[users.clamp(max=len(self.user_mean) - 1)], pred)
        pred = torch.where(i_ok & ~u_ok, self.item_mean[items.clamp(max=len(self.item_mean) - 1)], pred)
        counts = dict(item_mean=int((i_ok & ~u_ok).sum()), user_mean=int((u_ok & ~i_ok).sum()),
                      global_mean=int((~u_ok & ~i_ok).sum()))
        return pred, counts, u_ok & i_ok

    @overload
    def predict_entries(self, users: Tensor, items: Tensor,
                        return_counts: Literal[False] = ...) -> Tensor: ...
    @overload
    def predict_entries(self, users: Tensor, items: Tensor,
                        return_counts: Literal[True]) -> Tuple[Tensor, Dict[str, int]]: ...
    @overload
    def predict_entries(self, users: Tensor, items: Tensor, return_counts: bool = ...
                        ) -> Union[Tensor, Tuple[Tensor, Dict[str, int]]]: ...

    @on_cpu_default
    def predict_entries(self, users: Tensor, items: Tensor, return_counts: bool = False
                        ) -> Union[Tensor, Tuple[Tensor, Dict[str, int]]]:
        r"""Predicted ratings of the ``(users[e], items[e])`` pairs, on the rating scale.

        Args:
            users, items (Tensor): int64 ``(n,)`` indices in the id maps of the
                training ratings (a test part read with :func:`read_split`
                shares them).  Indices without training ratings (or beyond the
                fitted shape) get the mean fallback.
            return_counts (bool): also return the fallback counts.

        Returns:
            float32 ``(n,)`` on the CPU, clipped to the rating scale; with
            ``return_counts``, ``(prediction, counts)``, ``counts`` a dict of
            the entries each mean fallback took, as :meth:`fallback`'s.
        """
        self._check_built()
        return_counts = as_flag(return_counts, "return_counts")
        users, items = _index_tensor(users, "users"), _index_tensor(items, "items")
        if users.shape != items.shape or users.dim() != 1:
            raise ValueError(f"users and items must be 1-D of one length, got "
                             f"{tuple(users.shape)} and {tuple(items.shape)}")
        _check_non_negative(users, items)
        self._check_data()
        pred, counts, known = self._means(users, items)  # (indices checked: not fallback's)
        if bool(known.any()):
            # the fitted orientation: hparams may have been edited since (for a next fit)
            row, col = ((items, users) if self._norm.orientation == "item"
                        else (users, items))
            pred[known] = self._network_predict(row[known], col[known])
        return (pred, counts) if return_counts else pred

    @torch.no_grad()
    def _network_predict(self, row: Tensor, col: Tensor) -> Tensor:
        """The network's predictions at ``(row, col)``, batches of rows, decoder sampled there."""
        was_training = self.training
        self.eval()
        device, width = self.device, self._shape[1]
        # the parameters' dtype: a model converted since fit (model.double()) is fed its own
        # (the layer refused the float32 matrix: "input must have the weight's dtype")
        dtype = next(self.parameters()).dtype
        dataset = SparseRowDataset(self._input)
        out = torch.empty(row.shape[0], dtype=torch.float32)  # (not torch's default dtype)
        order = torch.argsort(row, stable=True)
        row_s, col_s = row[order], col[order]
        unique, inverse = torch.unique_consecutive(row_s, return_inverse=True)
        # the fitted batch size (checked): hparams may have been edited since
        step = max(getattr(self, "_fit_hparams", self.hparams)["batch_size"], 256)
        for start in range(0, unique.shape[0], step):
            chunk = unique[start:start + step]
            take = (inverse >= start) & (inverse < start + chunk.shape[0])
            pos, c = inverse[take] - start, col_s[take]
            batch = dataset.collate([dataset[int(i)] for i in chunk]).to(device)
            key = pos * width + c
            ukey, where = torch.unique(key, return_inverse=True)  # sorted, distinct
            # ukey is sorted and distinct: the pattern is coalesced as built
            pattern = coo_tensor(torch.stack([ukey // width, ukey % width]),
                                 torch.ones(ukey.shape[0], dtype=torch.float32),
                                 (chunk.shape[0], width),
                                 coalesced=True).to(device)
            x = batch.input if batch.input.dtype == dtype else batch.input.to(dtype)
            est = self(x, batch.row_index, pattern).to_sparse_coo().coalesce()
            values = self._norm.denormalize(
                est.values(), batch.row_index[est.indices()[0]]).cpu()
            out[order[take]] = values[where].to(out.dtype)  # float32 predictions, as the fallback's
        self.train(was_training)
        return out

    def _check_maps(self, ratings: Ratings, name: str) -> None:
        """``ValueError`` unless ``ratings``' ids index as in training (extra ids may follow)."""
        _check_same_maps(ratings, self._train, name, "the training ratings")

    @on_cpu_default
    def predict(self, ratings: Ratings) -> Tensor:
        """Predicted ratings of every entry of ``ratings`` (its maps = the training maps)."""
        _check_ratings(ratings, "ratings")
        self._check_built()
        self._check_maps(ratings, "ratings")
        return self.predict_entries(ratings.user, ratings.item)

    @on_cpu_default
    def evaluate(self, ratings: Ratings) -> Dict[str, float]:
        """``{"rmse", "mae", "count", "fallback", "fallback_counts"}`` of the predictions of
        ``ratings``: ``fallback`` the ratings predicted by a mean fallback,
        ``fallback_counts`` those per fallback (``item_mean``, ``user_mean``,
        ``global_mean``)."""
        _check_ratings(ratings, "ratings")
        self._check_built()
        self._check_maps(ratings, "ratings")
        if len(ratings) == 0:
            raise ValueError("ratings holds no ratings; there is nothing to evaluate")
        pred, counts = self.predict_entries(ratings.user, ratings.item, return_counts=True)
        errors = RatingErrors()
        errors.update(pred, ratings.rating.to(torch.float32).cpu())
        result: Dict[str, Any] = errors.compute()
        result["fallback"] = sum(counts.values())
        result["fallback_counts"] = counts
        return result

    @on_cpu_default
    def evaluate_ranking(self, test: Ratings, k: int = 10, *, threshold: Optional[float] = None,
                         exclude_train: bool = True, batch_size: int = 256,
                         progress: Optional[bool] = None) -> Dict[str, Any]:
        r"""Top-``k`` ranking quality on ``test``: precision, recall, NDCG and hit rate at ``k``.

        The full-ranking protocol (RecBole's "full sort" evaluation): every user with at
        least one relevant test rating is evaluated; all items are ranked for them, not a
        sample, and the scores are averaged over these users.

        * **Candidates.** Every item of the id maps (``test.n_items``: the items of
          training and test), less, with ``exclude_train``, the items the user rated in
          the model's training ratings (``train`` given to ``fit``, with the validation
          part after a refit: the items :meth:`recommend` leaves out with
          ``exclude_rated``; without a refit the validation part, never trained on,
          stays a candidate).  A user with fewer than ``k`` candidates gets a shorter
          list; its empty places are misses.
        * **Scores.** The raw predicted ratings, :meth:`predict_entries`'s: the
          network's output where the user and the item have training ratings, the mean
          fallback elsewhere (an item without training ratings gets the user's mean, the
          same score for all such items; a user without training ratings is ranked by
          the item means), clipped to the rating scale as there.  Unlike
          :meth:`recommend`, no shrinkage and no ``min_support``: the model's own
          ranking.  The network's part comes from its dense output rows, where
          :meth:`predict_entries` samples the decoder at the pairs asked: the two agree
          to float rounding (a few units in the last place, about ``5e-7`` stars;
          :meth:`predict_entries`'s own figures vary as much with the pairs asked
          together), so two items whose scores agree that closely may come in either
          order.
        * **Order.** Score descending; ties (predictions clipped to the top of the
          scale tie often) go to the smaller item index, so the lists are
          deterministic.  A NaN prediction ranks after every number and is never a
          hit.
        * **Relevant.** The user's test items (``threshold=None``: RecBole's choice
          for explicit ratings), or those rated ``>= threshold``; a test item rated
          below ``threshold`` stays a candidate (ranked, never a hit).  ``hits`` is
          the number of relevant items in the top ``k``; ``n`` the user's relevant
          items.
        * ``precision@k = hits / k``;
          ``recall@k = hits / n`` (RecBole's, and the usual definition: it can stay
          below 1 when ``n > k``; ``hits / min(k, n)`` would rescale it per user and
          make it incomparable with published figures);
          ``ndcg@k = DCG / IDCG`` with binary relevance,
          ``DCG = sum over hits at positions p = 1..k of 1 / log2(p + 1)`` and
          ``IDCG`` the same sum over ``p = 1..min(k, n)``;
          ``hit_rate@k`` is 1 when ``hits >= 1``.  Each is the mean over the
          evaluated users.

        The scores are computed ``batch_size`` rows of the model's matrix at a time
        from its dense output: a user-oriented model ranks ``batch_size`` users
        (``batch_size x items`` scores) at once; an item-oriented one scores
        ``batch_size`` items for every evaluated user and keeps a running top ``k``
        per user.  The ``users x items`` score matrix is never built (480,000 x 17,770
        floats would be 34 GB), but each chunk is ``batch_size`` dense rows of the
        matrix's full width: for an item-oriented model ``batch_size`` x the training
        users, and the merge into every evaluated user's top ``k`` beside them.
        Measured on 100,000 training users (40,940 evaluated) x 2,000 items: +530 MB
        at 256, +290 MB at 64, +9 MB at 8 (the whole 40,940 x 2,000 score matrix
        would be 330 MB); Netflix's 480,189 users would take a few GB at 256.  A
        smaller ``batch_size`` holds less, for a little more time.  The work runs on
        the model's device, without gradients and in eval mode (the mode is
        restored, also when an exception stops it).  ``docs/models.md`` says where the
        protocol differs from RecBole's.

        Args:
            test (Ratings): held-out ratings sharing the training ratings' id maps (extra
                ids may follow), with no (user, item) pair twice and, with
                ``exclude_train``, none the model trained on.
            k (int): the length of the lists; above the number of items, the lists
                hold every candidate (and ``precision@k`` still divides by ``k``).
                Default: 10.
            threshold (float, optional): the lowest relevant rating; ``None``: every
                test rating is relevant.  Default: ``None``.
            exclude_train (bool): leave each user's training items out of its ranking
                (the protocol's default; ``False`` ranks them too).  Default: ``True``.
            batch_size (int): matrix rows per forward pass (users for a user-oriented
                model, items for an item-oriented one).  Default: 256.
            progress (bool, optional): a tqdm bar on stderr; default: only on a
                terminal.

        Returns:
            dict: ``{"precision@k", "recall@k", "ndcg@k", "hit_rate@k"}`` (floats; the
            keys carry the value of ``k``, e.g. ``"ndcg@10"``) and ``"users"``, the
            number of evaluated users.

        Raises:
            TypeError: ``test`` not a :class:`Ratings`; ``k`` or ``batch_size`` not an
                int, ``threshold`` not a real number or None, flags not bools.
            ValueError: ``k`` or ``batch_size`` below 1; ``threshold`` not finite;
                ``test`` empty, with other id maps, repeating a pair or (with
                ``exclude_train``) holding a pair of the training ratings; no test
                rating reaching ``threshold``.
            RuntimeError: the model is not fitted.

        Example::

            >>> from nnsparse.data import synthetic_ratings, split_ratings
            >>> from nnsparse.models import KernelNet
            >>> train, test = split_ratings(synthetic_ratings(0, 60, 50, 1200), 0.2, seed=0)
            >>> model = KernelNet(hidden=8, epochs=1, validation_ratio=0.0)
            >>> model = model.fit(train, verbose=False, progress=False)
            >>> scores = model.evaluate_ranking(test, k=5, progress=False)
            >>> sorted(scores)
            ['hit_rate@5', 'ndcg@5', 'precision@5', 'recall@5', 'users']
            >>> all(0 <= v <= 1 for key, v in scores.items() if key != "users")
            True
        """
        from ._ranking import evaluate_ranking
        _check_ratings(test, "test")
        self._check_built()
        k = as_count("k", k, 1, must="positive")
        threshold = _checked_threshold(threshold)
        exclude_train = as_flag(exclude_train, "exclude_train")
        batch_size = as_count("batch_size", batch_size, 1, must="positive")
        if progress is not None:
            progress = as_flag(progress, "progress", "None or a bool")
        self._check_maps(test, "test")
        user, item = _relevant(test, threshold)  # refuses an empty test, none relevant
        self._check_data()
        _check_unique_pairs("test", test)
        if exclude_train:
            try:
                _check_unique_pairs("test together with the model's training ratings", test,
                                    self._train)
            except ValueError as error:
                raise ValueError(f"{error}; with exclude_train=True a training pair is left "
                                 f"out of the ranking, so a test rating of it could never be "
                                 f"a hit: test on held-out ratings, or pass "
                                 f"exclude_train=False") from None
        return evaluate_ranking(self, user, item, test.n_items, k, exclude_train, batch_size,
                                _show_progress(progress))

    # -- recommendation ---------------------------------------------------------------------
    @on_cpu_default
    def recommend(self, user: Any, k: int = 10, *, min_support: int = 20,
                  shrinkage: float = 10.0, exclude_rated: bool = True,
                  by_index: bool = False) -> Recommendations:
        r"""The ``k`` items this user would rate highest, among those worth showing.

        A prediction for an item with two ratings is an extrapolation; ranked
        raw, such items fill the top of every list.  So the candidates are the
        items with at least ``min_support`` training ratings, and they are
        ranked by the prediction shrunk towards the global mean by support:
        ``mean + n / (n + shrinkage) * (prediction - mean)``.

        Args:
            user: the user's original id (``by_index=False``) or index.
            k (int): how many items (a numpy int or a 0-d integer tensor too, as every
                count of nnsparse).
            min_support (int): fewest training ratings of a candidate item.
                Default: 20 (about the median item of MovieLens-100K).
            shrinkage (float): pseudo-ratings pulling a prediction to the
                global mean; 0 ranks by the prediction.  Default: 10.
            exclude_rated (bool): leave out the items the user rated in training.

        Returns:
            Recommendations: fewer than ``k`` when fewer items qualify.

        Raises:
            KeyError: unknown user.
            TypeError: a non-int ``k``, ``min_support`` or index, a non-number
                ``shrinkage``, non-bool flags.
            ValueError: negative ``k``, ``min_support`` or ``shrinkage``; an
                index outside ``[0, n_users)`` with ``by_index``.

        Example::

            >>> from nnsparse.data import synthetic_ratings
            >>> from nnsparse.models import KernelNet
            >>> r = synthetic_ratings(0, 60, 50, 1200)
            >>> model = KernelNet(hidden=8, epochs=1, validation_ratio=0.0)
            >>> model = model.fit(r, verbose=False, progress=False)
            >>> best = model.recommend(0, k=3, min_support=0)   # user id 0
            >>> type(best).__name__, len(best.ids), best.index.dtype
            ('Recommendations', 3, torch.int64)
            >>> bool((best.score[:-1] >= best.score[1:]).all())   # best first
            True
        """
        self._check_built()
        k = as_count("k", k, 0, must="non-negative")
        min_support = as_count("min_support", min_support, 0, must="non-negative")
        _check_number("shrinkage", shrinkage)
        exclude_rated = as_flag(exclude_rated, "exclude_rated")
        by_index = as_flag(by_index, "by_index")
        if not shrinkage >= 0:
            raise ValueError(f"shrinkage must be non-negative, got {shrinkage}")
        if real_float(shrinkage) == math.inf:  # (10**400 too: float() overflowed below)
            raise ValueError(f"shrinkage must be finite, got {shrinkage}")
        if by_index:
            try:
                if isinstance(user, bool) or (isinstance(user, (Tensor, np.ndarray))
                                              and user.ndim != 0):
                    raise TypeError  # tensor([3]) passed operator.index; the id path refuses it
                user = operator.index(user)
            except TypeError:
                raise TypeError(f"user must be an int index with by_index=True, got "
                                f"{type(user).__name__}") from None
            n_users = self.user_count.shape[0]
            if not 0 <= user < n_users:
                raise ValueError(f"user index must be in [0, {n_users}), got {user}")
            index = user
        else:
            index = self.user_index(user)
        n_items = self.item_count.shape[0]
        items = torch.arange(n_items)
        pred = self.predict_entries(torch.full((n_items,), index), items)
        support = self.item_count
        mu = self.global_mean
        score = mu + support / (support + shrinkage).clamp(min=1e-12) * (pred - mu)
        keep = support >= max(min_support, 1)
        if exclude_rated:
            rated = self._train.item[self._train.user == index]
            keep[rated] = False
        score = torch.where(keep, score, torch.tensor(-math.inf))
        best = torch.topk(score, min(k, int(keep.sum())))
        idx = best.indices
        # items added to the shared item_map after the titles were read have none
        titles = [self.titles_[i] if self.titles_ and i < len(self.titles_) else ""
                  for i in idx.tolist()]
        return Recommendations([self.item_ids_[i] for i in idx.tolist()], idx, best.values,
                               pred[idx], support[idx], titles)

    def user_index(self, user: Any) -> int:
        """The index of a user's original id (ids read as text are tried as ints too)."""
        self._check_built()
        if isinstance(user, bool):  # True == 1 would find user 1
            raise TypeError("user must be an original user id, got bool")
        if isinstance(user, Tensor):  # hashed by identity: tensor(3) would never find user 3
            if user.dim() != 0 or not int_dtype(user.dtype):
                raise TypeError(f"user must be an original user id (a 0-d integer tensor at "
                                f"most), got {_a(str(user.dtype))} tensor of shape "
                                f"{tuple(user.shape)}")
            refuse_meta(user, "user")
            user = int(user.item())
        try:
            hash(user)
        except TypeError:
            raise TypeError(f"user must be an original user id (hashable), got "
                            f"{type(user).__name__}") from None
        if self._user_lookup is None:  # cleared whenever fit or load sets the ids
            self._user_lookup = {u: i for i, u in enumerate(self.user_ids_)}
        for key in (user, _as_int(user), str(user)):
            if key in self._user_lookup:
                return self._user_lookup[key]
        raise KeyError(f"user {user!r} is not in the training data")

    # -- persistence --------------------------------------------------------------------
    @on_cpu_default
    def save(self, path: Any) -> None:
        """Save hyperparameters, normaliser, training ratings and weights (tensors and primitives only).

        ``RatingModel.load(path)`` (or the subclass's) rebuilds the model with
        no other argument, and ``torch.load(path, weights_only=True)`` reads the file.
        ``hparams`` edited since :meth:`fit` are checked again, as ``fit`` would,
        and saved as plain Python values (a numpy scalar as its number); edits
        of the settings of the next fit (``lr``, ``epochs``, a penalty) are
        saved, while an edit that no longer describes the fitted network
        (``orientation``, or a size such as ``hidden``) is refused: the file
        would not load.  A path is written whole or not at all (through a
        temporary file in its directory; a named pipe or a device, which is
        no regular file, is written directly; an existing file with other hard
        links is overwritten in place from the whole temporary file, so that
        every link holds the new model, with its space reserved first and an
        interrupt held until the copy is done).  A read-only file is refused,
        as ``open()`` and ``torch.save`` refuse it, not replaced.  A ``~`` in ``path``
        is the home directory, as in the rating readers.

        Raises:
            RuntimeError: the model is not fitted (or its last fit failed).
            TypeError: a ``path`` of the wrong kind (a text file object included);
                ``hparams`` of the wrong kind; a class not registered under its
                ``name`` (the file would load as another class).
            ValueError: ``path`` is a directory or has no parent directory, or a
                file object that is closed or not open for writing;
                ``hparams`` out of range or no longer matching the fitted
                network; weights that are not finite; a weight that
                ``torch.nn.utils.prune``, ``torch.nn.utils.parametrize`` (the
                ``parametrizations.weight_norm`` / ``spectral_norm`` too) or the older
                ``torch.nn.utils.weight_norm`` / ``spectral_norm`` hooks changed (its
                state is ``weight_orig`` and ``weight_mask``,
                ``parametrizations.weight.original``, ``weight_g`` and ``weight_v``,
                ..., which :meth:`load`'s layers, built from ``hparams``, lack): the
                message says how to make the change permanent first (``prune.remove``,
                ``parametrize.remove_parametrizations``, ``remove_weight_norm``,
                ``remove_spectral_norm``), after which the file holds the weight as
                the model computes it, or to save the whole model.
            PermissionError: ``path`` is an existing file the process may not
                write (read-only), as ``open()`` refuses it (``torch.save``
                refuses it too, with a ``RuntimeError``); nothing is written.
            OSError: the temporary file cannot be made in ``path``'s directory or
                renamed over ``path`` (a read-only directory: ``PermissionError``),
                naming ``path``; the system's error, which named the hidden temporary
                file, is its ``__cause__``.
            A refused save writes nothing and leaves the model as it was.
        """
        self._check_built()
        self._check_data()
        if isinstance(path, (str, os.PathLike)):
            path = _path(path)  # ~ expanded, as the rating readers expand it
        _path_to_write(path)
        self._check_registered()
        self._check_not_reparametrized()
        hparams = self._checked_hparams()
        self._check_network_hparams(hparams)
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        diverged = [k for k, v in state.items() if (v.is_floating_point() or v.is_complex())
                    and not bool(torch.isfinite(v).all())]
        if diverged:
            raise ValueError(f"{type(self).__name__} holds weights that are not finite "
                             f"({diverged}): its training diverged; fit it again (a smaller "
                             f"lr) before saving")
        norm = self._norm
        t = self._train
        _save_whole(dict(
            format=_FILE_FORMAT, model=self.name, hparams=hparams,
            normalizer=dict(orientation=norm.orientation, center=norm.center,
                            scale=list(norm.scale), row_mean=norm.row_mean.cpu(),
                            global_mean=norm.global_mean, shape=list(norm.shape)),
            train=dict(user=t.user.cpu(), item=t.item.cpu(), rating=t.rating.cpu()),
            # numpy ids or titles (maps or titles built by hand) as Python values: a
            # weights_only load takes no numpy scalar
            user_ids=[_plain(u) for u in self.user_ids_],
            item_ids=[_plain(i) for i in self.item_ids_],
            titles=None if self.titles_ is None else [_plain(t) for t in self.titles_],
            state=state, best_epoch=self.best_epoch,
            penalty_ratings=self.penalty_ratings), path)

    def _check_registered(self) -> None:
        """``TypeError`` unless ``MODELS[self.name]`` is this class: a file names its model,
        and load() would rebuild an unregistered subclass as the class it inherits the name
        of (other code, the same weights: other predictions)."""
        cls, known = type(self), MODELS.get(self.name)
        if known is None or (known.__module__, known.__qualname__) != (cls.__module__,
                                                                       cls.__qualname__):
            rebuilt = ("" if known is None else
                       f", which load() would rebuild as {_a(known.__name__)}")
            raise TypeError(f"{cls.__name__} is not registered under its name {self.name!r} "
                            f"(the name a model file holds{rebuilt}); give the class its own "
                            f"name and decorate it with nnsparse.models.register")

    def _check_not_reparametrized(self) -> None:
        """``ValueError`` naming each entry that torch's ``prune``, ``parametrize`` or the
        ``weight_norm`` / ``spectral_norm`` hooks changed, and what to do: a file holds the
        entries :meth:`build` makes (``load`` builds the layers from ``hparams``), not
        ``weight_orig`` / ``weight_mask``, ``weight_g`` / ``weight_v`` or
        ``parametrizations.weight.original`` (the message said "hparams no longer describe
        the fitted network", which they do)."""
        found = _reparametrized_entries(self)
        if not found:
            return
        what, fixes = [], []
        for module, tensor, kind, held in found:
            entry = f"{module}.{tensor}" if module else tensor
            layer = f"model.get_submodule({module!r})"
            prefix = f"{module}." if module else ""
            state = ", ".join(prefix + name for name in held[:-1])
            state = f"{state} and {prefix}{held[-1]}" if state else prefix + held[-1]
            tool, remove = _REPARAMETRIZATIONS[kind]
            what.append(f"{entry} {tool}: the state holds {state} instead)")
            fixes.append(f"torch.nn.utils.{remove}({layer}, {tensor!r})")
        hooks_only = all(kind != "parametrized" for _, _, kind, _ in found)
        whole = ("; or save the whole model, torch.save(model, path), read back with "
                 "torch.load(path, weights_only=False), which keeps these changes"
                 if hooks_only else "; or keep model.state_dict() and load it into a model "
                 "given the same changes (torch.save of the whole model refuses a "
                 "parametrized one)")
        raise ValueError(f"{type(self).__name__}.save() cannot save a model whose weights "
                         f"torch changed: {'; '.join(what)}; a model file holds the layers "
                         f"that load() builds from the hyperparameters, without these "
                         f"changes.  Make them permanent first, which keeps the weights as "
                         f"the model computes them now, then save(): "
                         f"{'; '.join(dict.fromkeys(fixes))}{whole} (nothing was written)")

    def _check_network_hparams(self, hparams: Dict[str, Any]) -> None:
        """``ValueError`` unless ``hparams`` (checked) still describe the fitted network:
        the normaliser's orientation, and the state :meth:`build` makes from them, shape
        for shape (built on the meta device: nothing allocated, no random number drawn)."""
        fitted = getattr(self, "_fit_hparams", None) or {}
        changed = [k for k in hparams if k in fitted and hparams[k] != fitted[k]]
        since = ("; changed since fit: " + ", ".join(f"{k} {fitted[k]!r} -> {hparams[k]!r}"
                                                       for k in changed)) if changed else ""
        advice = "; set them back, or fit again, before saving (the file would not load)"
        if hparams["orientation"] != self._norm.orientation:
            raise ValueError(f"hparams no longer describe the fitted network: orientation is "
                             f"{hparams['orientation']!r}, the model was fitted with "
                             f"{self._norm.orientation!r} rows{since}{advice}")
        features = getattr(self, "row_features", None)
        width = 0 if features is None else features.shape[1]
        try:
            fresh = self._fresh_build(hparams, width)
        except (NotImplementedError, RuntimeError):  # a build that reads a value back
            fresh = self._fresh_build(hparams, width, meta=False)
        own = self.state_dict()
        for key, value in fresh.state_dict().items():
            if key not in own or own[key].shape != value.shape:
                has = f"{tuple(own[key].shape)}" if key in own else "no such entry"
                raise ValueError(f"hparams no longer describe the fitted network: they build "
                                 f"{key} of shape {tuple(value.shape)}, the model has "
                                 f"{has}{since}{advice}")

    def _fresh_build(self, hparams: Dict[str, Any], features: int,
                     meta: bool = True) -> "RatingModel":
        """A new model of ``hparams`` holding what fit set before build (normaliser,
        statistics), which a build may read, built for this model's data: on the meta
        device (nothing allocated, no random number drawn), else with the caller's random
        state put back.  Not this model's hparams, nor nn.Module's own tables (layers,
        hooks).  Raises what the constructor or :meth:`build` raise."""
        fresh = type(self)(**hparams)
        internal = _MODULE_KEYS | {"hparams"}
        fresh.__dict__.update({k: v for k, v in self.__dict__.items() if k not in internal})
        if meta:
            with torch.device("meta"):
                fresh.build(*self._shape, features)
        else:
            with torch.random.fork_rng(devices=[]):
                fresh.build(*self._shape, features)
        return fresh

    def _built_state(self, hparams: Dict[str, Any], features: int
                     ) -> Optional[Dict[str, Tuple[int, ...]]]:
        """The shapes of the state :meth:`build` makes of ``hparams`` for this model's data
        (without ``row_features``), built on the meta device; ``None`` for a build that
        cannot run there (a subclass's build may raise anything on meta tensors: a loaded
        or copied model is then not checked, rather than refused), or refuses ``hparams``."""
        try:
            fresh = self._fresh_build(hparams, features)
        except Exception:
            return None
        return {k: tuple(v.shape) for k, v in fresh.state_dict().items()}

    @classmethod
    @on_cpu_default
    def load(cls, path: Any, device: Union[str, torch.device] = "cpu") -> "RatingModel":
        """A model saved by :meth:`save`, ready to predict (``weights_only`` loading).

        A ``~`` in ``path`` is the home directory, as in the rating readers.

        Raises:
            FileNotFoundError: no file at ``path``.
            TypeError: ``path`` of the wrong kind (a text file object included).
            ValueError: ``path`` is a directory or not a file written by
                :meth:`save`, or a file object that is closed or not open for
                reading; it holds another model class, or a model name that
                ``MODELS`` maps to no model class of that name (``MODELS`` edited by
                hand); an unknown ``device``.
            OSError, MemoryError: (torch's) the file could not be read, or not held
                in memory.
        """
        device = _as_device(device)
        if not isinstance(path, (str, os.PathLike)) and not (
                hasattr(path, "read") and hasattr(path, "seek")):
            raise TypeError(f"path must be a str, an os.PathLike or a readable file object, "
                            f"got {type(path).__name__}")
        if isinstance(path, (str, os.PathLike)):
            path = _path(path)  # ~ expanded, as the rating readers expand it
            if path.is_dir():
                raise ValueError(f"path must be a model file, got {path}, which is a directory")
            if not path.exists():
                raise FileNotFoundError(f"path: no file at {path}")
        else:
            check_file_object(path, "path", "read")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, MemoryError):  # the file could not be read (permissions, I/O) or
            raise                         # held in memory: the machine's error, not the file's
        # Anything else means the bytes are not a torch file this loader reads.  Junk
        # reaches torch's weights-only unpickler, which fails in many ways: struct.error
        # (shorter than a zip header), BadZipFile, UnpicklingError, and an IndexError
        # or ValueError from its stack for a text file such as /etc/passwd.
        except Exception as e:
            raise ValueError(f"{path} is not a model saved by nnsparse.models "
                             f"(RatingModel.save): {type(e).__name__}: {e}") from e
        if not isinstance(blob, dict) or blob.get("format") != _FILE_FORMAT:
            raise ValueError(f"{path} is not a model saved by nnsparse.models "
                             f"(RatingModel.save)")
        try:
            return cls._from_blob(blob, path, device)
        except (KeyError, TypeError, IndexError, AttributeError, RuntimeError) as e:
            # a dict with our format tag but missing or damaged parts
            raise ValueError(f"{path} is a damaged model file (RatingModel.save wrote "
                             f"something else): {type(e).__name__}: {e}") from e

    @classmethod
    def _from_blob(cls, blob: Dict[str, Any], path: Any, device: torch.device) -> "RatingModel":
        model_cls = MODELS.get(blob["model"])
        if model_cls is None:
            raise ValueError(f"{path} holds an unknown model {blob['model']!r} (registered: "
                             f"{sorted(MODELS)}; import the module that registers it first)")
        # MODELS edited by hand: another model's code, or no model class at all (its
        # AttributeError read as "a damaged model file": the file was not at fault)
        is_model = isinstance(model_cls, type) and issubclass(model_cls, RatingModel)
        if not is_model or model_cls.name != blob["model"]:
            mapped = (f"{model_cls.__name__}, named {model_cls.name!r}" if is_model
                      else f"{model_cls!r}, no RatingModel subclass")
            raise ValueError(f"{path} holds a model named {blob['model']!r}, but MODELS maps "
                             f"that name to {mapped}; register() keeps each class under its "
                             f"own name")
        if cls is not RatingModel and not issubclass(model_cls, cls):
            raise ValueError(f"{path} holds {_a(model_cls.__name__)}, not {_a(cls.__name__)}")
        hparams = blob["hparams"]
        if not isinstance(hparams, dict):
            raise ValueError(f"{path} is a damaged model file (RatingModel.save wrote something "
                             f"else): hparams must be a dict, got {type(hparams).__name__}")
        try:
            model = model_cls(**hparams)
        except (TypeError, ValueError) as e:  # (saved after an edit, before save checked them)
            raise ValueError(f"{path} holds hyperparameters {model_cls.__name__} refuses "
                             f"(edited after fit, then saved?): {e}") from e
        fitted = blob["normalizer"].get("orientation", model.hparams["orientation"])
        if fitted != model.hparams["orientation"]:  # square data would load wrong, silently
            raise ValueError(f"{path} holds hparams with orientation "
                             f"{model.hparams['orientation']!r}, but its normaliser was fitted "
                             f"with {fitted!r} rows (edited after fit, then saved?)")
        users, items = blob["user_ids"], blob["item_ids"]
        train = Ratings(blob["train"]["user"], blob["train"]["item"], blob["train"]["rating"],
                        {u: i for i, u in enumerate(users)}, {v: i for i, v in enumerate(items)},
                        titles=blob["titles"], source=str(path))
        n = blob["normalizer"]
        feats = blob["state"].get("row_features")
        # _prepare seeds torch for fit's sake: loading leaves the caller's CPU RNG as it was
        with torch.random.fork_rng(devices=[]):
            model._prepare(train, tuple(n["scale"]), feats, _penalty_ratings(blob, path))
        _check_blob(blob, model, path)
        model._norm.row_mean = n["row_mean"]
        model._norm.global_mean = n["global_mean"]
        model.load_state_dict(blob["state"], strict=False)
        model.best_epoch = blob["best_epoch"]
        model.to(device).eval()
        return model


def _check_blob(blob: Dict[str, Any], model: "RatingModel", path: Any) -> None:
    """The parts of a model file that a load would take without looking (a file missing a
    weight loaded with the fresh layer's random one): ``ValueError`` naming the part."""
    damaged = f"{path} is a damaged model file (RatingModel.save wrote something else)"
    missing = sorted(set(model.state_dict()) - set(blob["state"]))
    if missing:
        raise ValueError(f"{damaged}: its state lacks {missing}")
    for key, built in model.state_dict().items():
        saved = blob["state"][key]
        if not isinstance(saved, Tensor):
            continue  # load_state_dict names it
        if saved.shape != built.shape:  # before load_state_dict's long report
            raise ValueError(f"{damaged}: size mismatch for {key}: its hparams build "
                             f"{tuple(built.shape)}, its state holds {tuple(saved.shape)} "
                             f"(hparams edited after fit, then saved?)")
        if (saved.is_floating_point() or saved.is_complex()) \
                and not bool(torch.isfinite(saved).all()):
            raise ValueError(f"{path} holds weights that are not finite ({key}): the model it "
                             f"saved had diverged; fit it again")
    row_mean, expected = blob["normalizer"]["row_mean"], model._norm.row_mean
    if (not isinstance(row_mean, Tensor) or not row_mean.is_floating_point()
            or row_mean.shape != expected.shape):
        got = (f"{row_mean.dtype} of shape {tuple(row_mean.shape)}"
               if isinstance(row_mean, Tensor) else type(row_mean).__name__)
        raise ValueError(f"{damaged}: normalizer row_mean must be a floating tensor of shape "
                         f"{tuple(expected.shape)}, got {got}")
    mean = blob["normalizer"]["global_mean"]
    if not is_real(mean) or not math.isfinite(real_float(mean)):  # (nor a timedelta64)
        raise ValueError(f"{damaged}: normalizer global_mean must be a finite number, "
                         f"got {mean!r}")
    epoch = blob["best_epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"{damaged}: best_epoch must be an int >= 0, got {epoch!r}")


def _check_fitted_state(model: "RatingModel") -> None:
    """The fields of a fitted model that torch's unpickler set without :meth:`fit`'s care
    (``torch.load`` of a whole model, ``pickle``, ``copy.deepcopy``): each consistent with
    the others, or a ``ValueError`` / ``TypeError`` naming the field.  An edited file
    predicted silently wrong (counts shorter than the ids made known items fall back to
    means, NaN side features gave NaN) or failed far from the cause (an ``IndexError`` in
    ``predict``, a bare ``AssertionError`` for a missing layer)."""
    d = model.__dict__
    name = f"a loaded {type(model).__name__}"

    def shape_of(value: Any) -> str:
        return (f"{value.dtype} of shape {tuple(value.shape)}" if isinstance(value, Tensor)
                else f"{type(value).__name__} {value!r}"[:80])

    shape = d.get("_shape")
    if not (isinstance(shape, tuple) and len(shape) == 2
            and all(is_int(n) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise ValueError(f"{name}'s _shape must be (rows, width), two ints >= 0, got "
                         f"{shape_of(shape)}")
    norm = d.get("normalizer")
    if not isinstance(norm, RatingNormalizer):
        raise TypeError(f"{name}'s normalizer must be a RatingNormalizer, got "
                        f"{type(norm).__name__}")
    if tuple(norm.shape) != shape:
        raise ValueError(f"{name}'s normalizer has shape {tuple(norm.shape)}, its _shape is "
                         f"{shape}")
    row_mean = getattr(norm, "row_mean", None)
    if (not isinstance(row_mean, Tensor) or not row_mean.is_floating_point()
            or tuple(row_mean.shape) != (shape[0],)
            or not bool(torch.isfinite(row_mean).all())):
        raise ValueError(f"{name}'s normalizer row_mean must be a finite floating tensor of "
                         f"shape ({shape[0]},), got {shape_of(row_mean)}")
    x = d.get("_input")
    if isinstance(x, Tensor) and tuple(x.shape) != shape:
        raise ValueError(f"{name}'s training matrix has shape {tuple(x.shape)}, its _shape "
                         f"is {shape}")
    ids: Dict[str, List[Any]] = {}
    for who in ("user", "item"):
        known = d.get(f"{who}_ids_")
        if not isinstance(known, list):
            raise TypeError(f"{name}'s {who}_ids_ must be a list, got {type(known).__name__}")
        ids[who] = known
    rows = "item" if norm.orientation == "item" else "user"
    width = "user" if rows == "item" else "item"
    if (len(ids[rows]), len(ids[width])) != shape:
        raise ValueError(f"{name} has {len(ids[rows])} {rows} ids and {len(ids[width])} "
                         f"{width} ids, its matrix is {shape} ({rows}s x {width}s)")
    for who, known in ids.items():
        n = len(known)
        count, mean = d.get(f"{who}_count"), d.get(f"{who}_mean")
        if (not isinstance(count, Tensor) or count.dtype != torch.int64
                or tuple(count.shape) != (n,)
                or (n and int(count.min()) < 0)):
            raise ValueError(f"{name}'s {who}_count must be an int64 tensor of {n} counts >= 0 "
                             f"(one per {who} id), got {shape_of(count)}")
        if (not isinstance(mean, Tensor) or not mean.is_floating_point()
                or tuple(mean.shape) != (n,) or not bool(torch.isfinite(mean).all())):
            raise ValueError(f"{name}'s {who}_mean must be a finite floating tensor of {n} "
                             f"means (one per {who} id), got {shape_of(mean)}")
    mean = d.get("global_mean")
    # (is_real: not a bool, nor a numpy timedelta64; real_float: 10**400 is inf, where
    # math.isfinite raised OverflowError)
    if not is_real(mean) or not math.isfinite(real_float(mean)):
        raise ValueError(f"{name}'s global_mean must be a finite number, got {mean!r}")
    # as fit stores it: a Fraction passed, then torch.full refused it at the first predict
    # ("argument 'fill_value' must be Number, not Fraction")
    d["global_mean"] = real_float(mean)
    features = model._buffers.get("row_features")
    if features is not None and (not features.is_floating_point() or features.dim() != 2
                                 or features.shape[0] != shape[0]):
        raise ValueError(f"{name}'s row_features must be a floating tensor of {shape[0]} "
                         f"rows (one per matrix row), got {shape_of(features)}")
    if features is not None and not bool(torch.isfinite(features).all()):
        raise ValueError(f"{name}'s row_features must be finite (as fit's features), got "
                         f"NaN or infinite values")
    # the layers: what build() makes of the hyperparameters it read (on the meta device)
    fitted = d.get("_fit_hparams")
    if not isinstance(fitted, dict):
        return  # (a model pickled by an nnsparse before _fit_hparams: its layers as they are)
    built = model._built_state(fitted, 0 if features is None else features.shape[1])
    if built is None:
        return  # a build that needs data (not on the meta device): not checked here
    # each entry it builds, of its shape; not the entries of a layer that torch's tools
    # reparametrised (prune: weight_orig and weight_mask; parametrize: parametrizations.*;
    # the weight_norm and spectral_norm hooks: weight_g, weight_v, ...),
    # nor the entries a user added (a copy of such a model is that model)
    tooled = tuple(dict.fromkeys(f"{module}." for module, *_ in _reparametrized_entries(model)
                                 if module))
    own = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(tooled)}
    built = {k: v for k, v in built.items() if not k.startswith(tooled)}
    differ = sorted(k for k in built if own.get(k) != built[k])
    if differ:
        raise ValueError(f"{name}'s layers are not those its fitted hyperparameters build: "
                         + "; ".join(f"{k}: built {built.get(k, 'no such entry')}, loaded "
                                     f"{own.get(k, 'no such entry')}" for k in differ[:4]))


# kind -> (what the message says of the entry, the torch.nn.utils call that removes it)
_REPARAMETRIZATIONS = {
    "pruned": ("is pruned (torch.nn.utils.prune", "prune.remove"),
    "weight_norm": ("is weight-normalized (torch.nn.utils.weight_norm", "remove_weight_norm"),
    "spectral_norm": ("is spectrally normalized (torch.nn.utils.spectral_norm",
                      "remove_spectral_norm"),
    "parametrized": ("is parametrized (torch.nn.utils.parametrize",
                     "parametrize.remove_parametrizations"),
}


def _reparametrized_entries(model: nn.Module) -> List[Tuple[str, str, str, List[str]]]:
    """``(module name, tensor name, kind, the module's entries that replace the tensor)``
    for each entry of ``model`` that torch's ``prune`` (kind ``"pruned"``),
    ``weight_norm`` / ``spectral_norm`` hooks or ``parametrize`` (``"parametrized"``)
    changed, in module order."""
    found = []
    for name, module in model.named_modules():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, prune.BasePruningMethod):
                tensor = str(hook._tensor_name)
                found.append((name, tensor, "pruned", [f"{tensor}_orig", f"{tensor}_mask"]))
            elif isinstance(hook, WeightNorm):
                found.append((name, hook.name, "weight_norm",
                              [f"{hook.name}_g", f"{hook.name}_v"]))
            elif isinstance(hook, SpectralNorm):
                found.append((name, hook.name, "spectral_norm",
                              [f"{hook.name}_{x}" for x in ("orig", "u", "v")]))
        if parametrize.is_parametrized(module):
            for tensor, originals in module.parametrizations.items():
                held = [f"parametrizations.{tensor}.{key}" for key in originals.state_dict()
                        if key.startswith("original")]
                found.append((name, str(tensor), "parametrized", held))
    return found


class _CsrParts(NamedTuple):
    """A CSR matrix as plain tensors (``RatingModel.__getstate__``)."""

    crow: Tensor
    col: Tensor
    values: Tensor
    size: Tuple[int, ...]


def _state_of(module: nn.Module) -> List[Tensor]:
    """``module``'s parameters and buffers (held: their ids stay theirs, not reused by
    the tensors a build makes once it replaced the layers)."""
    return list(itertools.chain(module.parameters(), module.buffers()))


def _made_float32(module: nn.Module, before: List[Tensor], default: torch.dtype) -> None:
    """The parameters and buffers of ``module`` not in ``before`` (a build made them) that
    are in torch's default dtype ``default`` (not float32: made without a ``dtype``)
    converted to float32, as ``module.float()`` converts them; the others left as made."""
    held = {id(t) for t in before}
    module._apply(lambda t: (t.to(torch.float32)  # type: ignore[no-untyped-call]
                             if t.dtype == default and id(t) not in held else t))


def _check_rows(rows: Any, x: Any, bound: int) -> None:
    """A batch's ``rows``: an integer tensor, one matrix row per row of ``x``, in
    ``[0, bound)`` when on the CPU (reading them there costs no device sync; on an
    accelerator the range is not read back inside a training step)."""
    if not isinstance(rows, Tensor) or rows.dtype not in (torch.int64, torch.int32):
        got = rows.dtype if isinstance(rows, Tensor) else type(rows).__name__
        raise TypeError(f"rows must be an int64 tensor of matrix rows, got {got}")
    refuse_meta(rows, "rows")
    n = x.shape[0] if isinstance(x, Tensor) and x.dim() == 2 else None
    if rows.dim() != 1 or (n is not None and rows.shape[0] != n):
        raise ValueError(f"rows must be 1-D with one matrix row per row of x ({n}), "
                         f"got shape {tuple(rows.shape)}")
    if rows.device.type == "cpu":
        check_index_range(rows, bound, "rows")


def _check_non_negative(users: Tensor, items: Tensor) -> None:
    """``ValueError`` for a negative index (torch would read it from the end)."""
    for name, index in (("users", users), ("items", items)):
        if index.numel() and int(index.min()) < 0:
            raise ValueError(f"{name} must be non-negative, got min {int(index.min())}")


def _index_tensor(value: Any, name: str) -> Tensor:
    """``value`` as an int64 CPU tensor; ``TypeError`` unless it holds integers."""
    try:
        index = as_tensor(value)  # (np.flip(a) too: copied)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be an integer tensor (or a list of ints), got "
                        f"{type(value).__name__}") from None
    if index.layout != torch.strided:
        raise TypeError(f"{name} must be a dense integer tensor, got layout {index.layout}")
    if not int_dtype(index.dtype):
        raise TypeError(f"{name} must be an integer tensor, got {index.dtype}")
    refuse_meta(index, name)
    return index.long().cpu()


def _as_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device``, or an error that names the argument."""
    out = as_device(device)
    refuse_meta_device(out)
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(out)!r} was asked for, but torch sees no CUDA device")
    return out


def _check_number(name: str, value: Any, alternative: str = "") -> None:
    """``TypeError`` unless ``value`` is a real number (not a bool, str, tensor or
    numpy timedelta64: :func:`~nnsparse._forms.is_real`)."""
    if not is_real(value):
        raise TypeError(f"{name} must be a real number{alternative}, got "
                        f"{type(value).__name__} {value!r}")


def _differs(value: Any, default: Any) -> bool:
    """Whether a hyperparameter is away from its default, for the repr: a value whose ``!=``
    gives no bool (an array) or fails counts as away (shown)."""
    try:
        return bool(value != default)
    except Exception:  # (an array's ambiguous truth value, a comparison that raises)
        return True


def _brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for the model's repr, cut to ``limit`` characters; never raises."""
    try:
        text = repr(value)
    except Exception:  # (an int beyond Python's digit limit, a broken __repr__)
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"  # np.str_("auto") too


def _is_penalty(key: str) -> bool:
    """Whether a hyperparameter is a penalty weight (``l2``, ``l2_kernel``): the only kind
    that may be ``"auto"`` (see ``RatingModel.AUTO``)."""
    return key.startswith("l2")


# The attributes nn.Module.__init__ sets (its tables of layers, parameters and hooks)
_MODULE_KEYS = frozenset(nn.Module().__dict__)


def _is_checked(key: str) -> bool:
    """Whether :meth:`RatingModel._checked_hparams` checks ``key``'s kind (the common
    hyperparameters, the sizes, rates and penalties), for which ``"auto"`` is refused
    unless the class lists it in ``AUTO``; a subclass's own key is the subclass's."""
    return key in _COMMON or _is_penalty(key) or key in _CHECKED


# the largest float32: a loss weight beyond it cannot weigh the float32 losses
_FLOAT32_MAX = torch.finfo(torch.float32).max

# The hyperparameters of the built-in models that _checked_hparams checks, beside _COMMON
_CHECKED = ("alpha", "beta", "hide_ratio", "hidden", "layers", "dim")


def _plain_hparam(key: str, value: Any) -> Any:
    """``value`` as a plain Python value a model file holds (``torch.load(weights_only=True)``
    reads no numpy scalar, no arbitrary object): numpy scalars and number subclasses as
    ``bool`` / ``int`` / ``float`` / ``complex`` / ``str``; a ``torch.dtype`` or
    ``torch.device`` as it is; lists, tuples and dicts of them, element-wise."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or type(value) in (bool, int, float, complex, str) \
            or isinstance(value, (torch.dtype, torch.device)):
        return value  # (bool has no subclasses: every bool is returned here)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        items = [_plain_hparam(key, v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {_plain_hparam(key, k): _plain_hparam(key, v) for k, v in value.items()}
    raise TypeError(f"hyperparameter {key} must be None, a bool, a number, a str, a "
                    f"torch.dtype or torch.device, or a list, tuple or dict of them (what a "
                    f"model file holds), got "
                    f"{type(value).__name__} {value!r}")


def _penalty_ratings(blob: Dict[str, Any], path: Any) -> Optional[int]:
    """The training ratings a saved model's ``"auto"`` hyperparameters were set for
    (files written before they were saved: ``None``, the saved ratings' count)."""
    n = blob.get("penalty_ratings")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"{path} is a damaged model file (RatingModel.save wrote something "
                         f"else): penalty_ratings must be an int >= 1, got {n!r}")
    return n


def _path_to_write(path: Any) -> None:
    """``ValueError`` for a path ``torch.save`` cannot write: a directory, a missing parent."""
    if not isinstance(path, (str, os.PathLike)) and not hasattr(path, "write"):
        raise TypeError(f"path must be a str, an os.PathLike or a writable file object, "
                        f"got {type(path).__name__}")
    if isinstance(path, (str, os.PathLike)):
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"path must be a file to write, got {p}, which is a directory")
        if not p.parent.is_dir():
            raise ValueError(f"path: no directory {p.parent} to write {p.name} in")
    else:
        check_file_object(path, "path", "write")


def _save_whole(blob: Dict[str, Any], path: Any) -> None:
    """``torch.save(blob, path)``; a path is written through a temporary file in its
    directory, renamed over it once whole: a failed save leaves no partial file, and
    an existing file as it was.  (A file object, and a path that is not a regular file, a
    named pipe or a device such as /dev/null, are written as given: renamed over, the
    pipe's reader would get nothing, and the device node would become a file.)

    An existing file is opened for writing first, before anything is written: one
    the process may not write (read-only) is refused with the ``PermissionError``
    that ``open()`` raises there, naming ``path`` (``torch.save`` refuses it too,
    with a ``RuntimeError`` naming no path), rather than renamed over.  One with other hard links is written in place, from the whole
    temporary file (renamed over, this name would get a new file and the other
    names keep the old model), by :func:`_copy_into`: a failed serialisation leaves
    it as it was, and the copy reserves its space first and holds an interrupt until
    it is done."""
    if not isinstance(path, (str, os.PathLike)) or (os.path.exists(path)
                                                     and not os.path.isfile(path)):
        torch.save(blob, path)
        return
    target = Path(os.path.realpath(path))  # through a link, as torch.save wrote
    linked = _open_to_write(path)  # (None: no file yet)
    try:
        if linked is not None and os.fstat(linked).st_nlink == 1:
            os.close(linked)  # renamed over: its writability was all to check
            linked = None
        # (the name's first 50 characters: a valid name of up to 255 bytes, NAME_MAX, got
        # 18 more and "File name too long"; 50 characters are 200 bytes at most in UTF-8)
        tmp = target.with_name(f".{target.name[:50]}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            f = open(tmp, "xb")  # the umask's mode, as a plain open; (outside the try: ours only)
        except OSError as error:  # a read-only directory: its error named the hidden file
            raise _naming(error, path, target) from error
        try:
            with f:
                torch.save(blob, f)
            if linked is not None:
                _copy_into(tmp, linked)  # the same file for every link, its mode and owner kept
                tmp.unlink()
                return
            if target.exists():
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
            try:
                os.replace(tmp, target)
            except OSError as error:  # (a sticky directory, another user's file: EPERM)
                raise _naming(error, path, target) from error
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        if linked is not None:
            os.close(linked)


def _naming(error: OSError, path: Any, target: Path) -> OSError:
    """``error`` of the temporary file (its creation or its rename over ``target``) as the
    same kind of error naming ``path``, the path the user gave, not the hidden file: "[Errno
    13] Permission denied (...): 'path'", the way of writing said in its words."""
    why = (f"{error.strerror or error} (a save writes a temporary file in {target.parent}, "
           f"then renames it to the path given)")
    try:
        return type(error)(error.errno, why, os.fspath(path))
    except TypeError:  # a subclass with other arguments: the kind its errno maps to
        return OSError(error.errno, why, os.fspath(path))


def _open_to_write(path: Any) -> Optional[int]:
    """A descriptor of the existing file at ``path`` opened to write (nothing written,
    nothing truncated), or None where there is no file.  ``PermissionError`` naming
    ``path`` where the process may not write it, as ``open(path, "wb")`` would."""
    try:
        return os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None


def _copy_into(source: Path, fd: int) -> None:
    """Overwrite the file open at ``fd`` in place (same inode) with ``source``'s bytes.

    The new length is reserved first where the system can (``posix_fallocate``): a
    disk too full for it fails before a byte is overwritten, and the file gets its
    old length back.  An interrupt (``KeyboardInterrupt``) arriving during the
    reservation or the copy is held until the copy is done, then raised (raised
    between the two, it would leave the old model with zeros appended)."""
    size, old = source.stat().st_size, os.fstat(fd).st_size
    with _interrupts_held():
        if size > old and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as error:
                os.ftruncate(fd, old)  # what a partial reservation appended
                if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise  # (those: no reservation on this file system; the copy goes on)
        with open(source, "rb") as src, open(fd, "wb", closefd=False) as dst:
            shutil.copyfileobj(src, dst)
            dst.truncate()


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT held during the block, then delivered again to the handler it had.

    Only the main thread runs Python's signal handlers, so elsewhere (and where a
    handler cannot be set) the block runs as it is."""
    held: List[int] = []
    previous = signal.getsignal(signal.SIGINT)
    try:
        if previous is not None:  # None: a handler set outside Python, not to be put back
            signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread of the main interpreter
        previous = None
    if previous is None:  # (yielded outside the handler: the block's errors unchained)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


def _as_int(text: Any) -> Any:
    """An id given as text, tried as an int (a float such as 1.5 is never rounded to 1)."""
    if not isinstance(text, str):
        return text
    try:
        return int(text)
    except ValueError:
        return text
