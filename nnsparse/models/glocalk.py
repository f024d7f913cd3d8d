"""GLocal-K (Han, Halim, Poon & Jiang, CIKM 2021): Sparse FC pre-training, then a global kernel.

Stage 1 (pre-training) is :class:`~nnsparse.models.KernelNet`'s training as
it is.  Stage 2 (fine-tuning) puts a *global kernel* in front of the same
network: the pre-trained network's output on the whole training matrix
``R`` (rows x width, raw ratings, 0 where missing) is averaged per row into
a vector ``p`` of length ``rows``; a trainable ``conv_kernel`` (``rows x
gk_size**2``) maps it to a ``gk_size x gk_size`` kernel ``G = (p @
conv_kernel) * dot_scale``; the network's input becomes ``relu(conv2d(R,
G))`` ('same' padding, one channel) instead of ``R``, and the whole model
(the local network's weights reused, ``conv_kernel``, and ``p`` through the
same network: the reference differentiates it too) is trained again on the
observed ratings with the same penalties.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import distributed as nd
from .. import values_map
from .._forms import as_count, is_real, real_float
from ..layers import sampled_linear, sparse_linear
from .base import _is_auto, register
from .kernel import KernelNet
from .._optim_split import SplitOptimizer
from .trainer import Trainer, TrainResult

__all__ = ["GLocalK", "MAX_DENSE_ENTRIES"]

#: the largest ``rows x width`` training matrix the global kernel's dense stage takes
#: (its dense copy is ``4 * MAX_DENSE_ENTRIES`` bytes in float32: 512 MiB; MovieLens-1M's
#: 3,706 x 6,040 is 22.4 million entries, 90 MB)
MAX_DENSE_ENTRIES = 2 ** 27


def _global_kernel(pooled: Tensor, conv_kernel: Tensor, dot_scale: float, size: int) -> Tensor:
    """``(pooled @ conv_kernel) * dot_scale`` as a ``(1, 1, size, size)`` conv2d weight
    (row-major: entry ``(a, b)`` is column ``a * size + b`` of ``conv_kernel``)."""
    return ((pooled @ conv_kernel) * dot_scale).reshape(1, 1, size, size)


def _convolve_rows(padded: Tensor, rows: Tensor, kernel: Tensor) -> Tensor:
    """Rows ``rows`` of ``relu(conv2d(R, kernel, padding='same'))``, ``(len(rows), width)``.

    ``padded`` is the dense ``R`` with ``size // 2`` zero rows above and below; only the
    ``size`` rows around each requested row are read (no pass over the whole matrix)."""
    size = kernel.shape[-1]
    windows = padded[rows.unsqueeze(1) + torch.arange(size, device=rows.device)]
    out = F.conv2d(windows.unsqueeze(1), kernel, padding=(0, size // 2))
    return torch.relu(out.reshape(rows.shape[0], padded.shape[1]))


class _GLocalKTrainer(Trainer):
    """:class:`Trainer` whose ``weight_decay`` spares ``conv_kernel``: the reference
    (``GLocal_K.ipynb``) regularises the kernel layers only (``lambda_2`` on ``W``,
    ``lambda_s`` on the local kernel), never the global kernel's ``conv_kernel``."""

    def make_optimizer(self) -> torch.optim.Optimizer:
        opt = super().make_optimizer()
        kernel = getattr(self.model, "conv_kernel", None)
        parts = list(opt.optimizers.values()) if isinstance(opt, SplitOptimizer) else [opt]
        for part in parts:  # (before any step: no state to move)
            decayed = [g for g in part.param_groups
                       if g["weight_decay"] and any(p is kernel for p in g["params"])]
            for group in decayed:  # (one at most)
                group["params"] = [p for p in group["params"] if p is not kernel]
                part.param_groups[:] = [g for g in part.param_groups if g["params"]]
                part.add_param_group(dict(params=[kernel], weight_decay=0.0))
        return opt


@register
class GLocalK(KernelNet):
    r"""GLocal-K: :class:`KernelNet` (Sparse FC) pre-trained, then fine-tuned with a global kernel.

    ``fit`` trains in two stages, each with its own Adam run, cosine schedule and early
    stopping on the validation split:

    1. **pre-training**: :class:`KernelNet`'s training, unchanged (``epochs``, ``lr``);
    2. **fine-tuning** (``global_epochs``, ``global_lr``): the input of row ``i`` is row
       ``i`` of ``relu(conv2d(R, G))``, where ``R`` is the dense training matrix (raw
       stars, 0 where missing; rows are items for ``orientation="item"``) and ``G`` the
       ``gk_size x gk_size`` global kernel ``(p @ C) * dot_scale``, ``p`` the mean over
       each row of the network's own output on ``R`` and ``C`` a trainable ``(rows,
       gk_size**2)`` matrix (truncated normal, std 0.1).  Every weight is trained again,
       ``p``'s dependence on them included (as the reference code does); the objective
       is :class:`KernelNet`'s: its penalties (``l2``, ``l2_kernel``) are on the kernel
       layers only, and ``weight_decay`` (nnsparse's own, default 0) decays their
       matrices but not ``C``, which the reference code does not regularise.

    With a refit, the final model is trained on train + validation for the two stages'
    best epoch counts.  A fitted model predicts through the fine-tuned network.

    Hyperparameters: :class:`KernelNet`'s, plus ``gk_size`` (3; odd), ``dot_scale``
    (1.0; the paper: 1 on MovieLens-100K, 0.5 on MovieLens-1M), ``global_epochs``
    (100) and ``global_lr`` (1e-3).

    Memory: the fine-tuning keeps a dense copy of the ``rows x width`` training matrix
    (and each step reads ``gk_size`` rows per batch row of it); ``fit`` refuses a matrix
    above ``MAX_DENSE_ENTRIES`` (2**27) entries.  Each step also runs the network on
    every row of the matrix (for ``p``): about a pre-training epoch's products per step;
    a prediction computes ``G`` once (not per chunk of rows) while the weights stay the same.

    Example::

        >>> from nnsparse.data import synthetic_ratings
        >>> r = synthetic_ratings(0, 60, 50, 1200)
        >>> model = GLocalK(hidden=8, epochs=2, global_epochs=2, validation_ratio=0.0)
        >>> model.fit(r, verbose=False, progress=False).predict(r).shape
        torch.Size([1200])
    """

    name = "glocalk"
    DEFAULTS = dict(KernelNet.DEFAULTS, gk_size=3, dot_scale=1.0, global_epochs=100,
                    global_lr=1e-3)
    _TRAINER = _GLocalKTrainer

    @property
    def pretrain_epochs(self) -> int:
        """The pre-training's epochs in the last fit (chosen on validation; its refit trains
        as many; ``best_epoch`` is the fine-tuning's); 0 before a fit.  Saved with the model
        (the ``pretrain_best_epoch`` buffer)."""
        count = self._buffers.get("pretrain_best_epoch")
        return 0 if count is None else int(count)

    # -- hyperparameters ----------------------------------------------------------------
    def _check_own_hparams(self, h: Dict[str, Any]) -> None:
        for key in ("gk_size", "global_epochs", "dot_scale", "global_lr"):
            if _is_auto(h[key]):
                raise self._refuse_auto(key)
        h["gk_size"] = as_count("gk_size", h["gk_size"], 1)
        if h["gk_size"] % 2 == 0:
            raise ValueError(f"gk_size must be odd (the global kernel is centred on each "
                             f"entry, 'same' padding), got {h['gk_size']}")
        h["global_epochs"] = as_count("global_epochs", h["global_epochs"], 1)
        for key in ("dot_scale", "global_lr"):
            value = h[key]
            if not is_real(value):
                raise TypeError(f"{key} must be a real number, got {type(value).__name__} "
                                f"{value!r}")
            number = real_float(value)  # (10**400: inf, not float()'s OverflowError)
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"{key} must be positive and finite, got {value!r}")
            h[key] = number

    def _check_network_hparams(self, hparams: Dict[str, Any]) -> None:
        super()._check_network_hparams(hparams)
        fitted = getattr(self, "_fit_hparams", None) or {}
        if "dot_scale" in fitted and hparams["dot_scale"] != fitted["dot_scale"]:
            raise ValueError(f"hparams no longer describe the fitted network: dot_scale is "
                             f"{hparams['dot_scale']!r}, the model was fitted with "
                             f"{fitted['dot_scale']!r} (it scales the global kernel the "
                             f"weights were trained with); set it back, or fit again, before "
                             f"saving")

    # -- layers -------------------------------------------------------------------------
    def build(self, rows: int, width: int, features: int) -> None:
        super().build(rows, width, features)
        size = self.hparams["gk_size"]
        self.conv_kernel = nn.Parameter(
            nn.init.trunc_normal_(torch.empty(rows, size * size, dtype=torch.float32),
                                  std=0.1, a=-0.2, b=0.2))
        # whether the network reads the global kernel's input (fine-tuning and after): a
        # buffer, so a saved model and the trainer's best-epoch snapshots carry the stage
        self.register_buffer("finetuned", torch.zeros((), dtype=torch.bool))
        # the pre-training's chosen epochs: a buffer, so a saved model carries it; kept over
        # a rebuild, as the refit reads it (a fresh fit sets it after its pre-training)
        self.register_buffer("pretrain_best_epoch",
                             torch.tensor(self.pretrain_epochs, dtype=torch.long))
        self.__dict__.pop("_dense", None)
        self.__dict__.pop("_kernel_cache", None)

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state.pop("_dense", None)  # a cache of the training matrix, made again on use
        state.pop("_kernel_cache", None)  # (and of the inference kernel)
        state.pop("_finetuned_cache", None)  # (and of the finetuned flag's value)
        return state

    def _finetuned(self) -> bool:
        """The ``finetuned`` buffer's value, read from the device once per value: every
        forward asks it, and ``bool()`` of a GPU tensor waits for the device (a host sync
        per training step).  Read again when the buffer is replaced (``.to()``, a load
        with ``assign``) or changed in place (``fill_``, a load's ``copy_``: its version)."""
        flag = self._buffers.get("finetuned")
        if flag is None:
            return False
        cached = self.__dict__.get("_finetuned_cache")
        if cached is not None and cached[0] is flag and cached[1] == flag._version:
            return bool(cached[2])
        value = bool(flag)
        self.__dict__["_finetuned_cache"] = (flag, flag._version, value)
        return value

    def _matrices(self, device: torch.device, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """The training matrix on the model's scale (raw stars), sparse, and dense with
        ``gk_size // 2`` zero rows above and below; made once per device, dtype and
        training matrix."""
        x = self._input
        cached = self.__dict__.get("_dense")
        if cached is not None and cached[0] is x and cached[1] == (device, dtype):
            return cached[2], cached[3]
        rows, width = self._shape
        if rows * width > MAX_DENSE_ENTRIES:  # (fit refuses it first)
            raise ValueError(_too_large(rows, width))
        raw = cast(Tensor, values_map(lambda v: self._to_model(v).to(dtype), x)).to(device)
        pad = self._fit_hparams["gk_size"] // 2  # (set with the matrix, by fit or load)
        dense = F.pad(raw.to_dense(), (0, 0, pad, pad))
        self.__dict__["_dense"] = (x, (device, dtype), raw, dense)
        return raw, dense

    # -- the network --------------------------------------------------------------------
    def pooled(self, weighted: Optional[Sequence[Tensor]] = None) -> Tensor:
        """``p``: the mean over each row of the network's output on the whole training
        matrix (the local network, without the global kernel), shape ``(rows,)``.

        ``weighted`` (the layers' ``W * K``, computed here by default) lets a forward share
        them.  Differentiable: the fine-tuning trains the weights through ``p`` too."""
        self._check_built()
        layers = self._layers()
        if weighted is None:
            weighted = [layer.weighted().weighted for layer in layers]
        param = layers[0].weight
        raw, _ = self._matrices(param.device, param.dtype)
        (first, *middle, last), (w_first, *w_middle, w_last) = layers, list(weighted)
        h = torch.sigmoid(sparse_linear(raw, w_first, first.bias))
        for layer, w in zip(middle, w_middle):
            h = torch.sigmoid(F.linear(h, w, layer.bias))
        # mean_j (h W_last^T + b)_j without the (rows, width) output
        return h @ w_last.mean(0) + last.bias.mean()

    def global_kernel(self, weighted: Optional[Sequence[Tensor]] = None) -> Tensor:
        """The ``(1, 1, gk_size, gk_size)`` global kernel ``(p @ conv_kernel) * dot_scale``."""
        fitted = self.__dict__.get("_fit_hparams") or self.hparams
        return _global_kernel(self.pooled(weighted), self.conv_kernel,
                              fitted["dot_scale"], fitted["gk_size"])

    def network(self, x: Any, rows: Tensor, pattern: Any = None) -> Any:
        if not self._finetuned():
            return super().network(x, rows, pattern)
        # fine-tuned: the rows ``rows`` of relu(conv2d(R, G)), R the model's training
        # matrix (``x`` holds those rows of it: fit and predict pass them)
        layers = self._layers()
        parts = [layer.weighted() for layer in layers]
        if torch.is_grad_enabled():
            self._parts = parts  # for penalty(), as KernelNet's forward
        else:
            self.__dict__.pop("_parts", None)
        weighted = [part.weighted for part in parts]
        kernel = (self.global_kernel(weighted) if torch.is_grad_enabled()
                  else self._inference_kernel(weighted))
        _, dense = self._matrices(kernel.device, kernel.dtype)
        h = _convolve_rows(dense, rows.to(kernel.device), kernel)
        (*hidden, last), (*w_hidden, w_last) = layers, weighted
        for layer, w in zip(hidden, w_hidden):
            h = torch.sigmoid(F.linear(h, w, layer.bias))
        return sampled_linear(h, w_last, last.bias, pattern)

    def _inference_kernel(self, weighted: Sequence[Tensor]) -> Tensor:
        """:meth:`global_kernel` without gradients, computed once for as long as the
        parameters and the training matrix stay the same: a prediction's chunks (each a
        call of :meth:`network`) share it instead of each running the network over the
        whole matrix for ``p``.  The parameters are compared by value with a copy (not by
        version counter: an edit through ``.data`` bumps none)."""
        params = [p.detach() for p in self.parameters()]
        cached = self.__dict__.get("_kernel_cache")
        if (cached is not None and cached[0] is self._input and len(cached[1]) == len(params)
                and all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
                        and torch.equal(a, b) for a, b in zip(cached[1], params))):
            return cast(Tensor, cached[2])
        kernel = self.global_kernel(weighted)
        self.__dict__["_kernel_cache"] = (self._input, [p.clone() for p in params], kernel)
        return kernel

    # -- training -----------------------------------------------------------------------
    def fit(self, train: Any, validation: Any = None, **kwargs: Any) -> "GLocalK":
        """:meth:`RatingModel.fit` in two stages (class docstring).

        Raises (beside :meth:`RatingModel.fit`'s):
            ValueError: a training matrix above ``MAX_DENSE_ENTRIES`` entries (the
                global kernel's stage is dense over it), before anything changes.
            NotImplementedError: under ``torchrun`` (a process group initialised):
                the fine-tuning's full-matrix pass is not distributed.
        """
        n_users, n_items = getattr(train, "n_users", None), getattr(train, "n_items", None)
        if isinstance(n_users, int) and isinstance(n_items, int) \
                and n_users * n_items > MAX_DENSE_ENTRIES:
            raise ValueError(_too_large(n_items, n_users))
        if nd.is_distributed():
            raise NotImplementedError("GLocalK does not train under torchrun yet: its global "
                                      "kernel reads the network's output on every row of the "
                                      "matrix at each step; use KernelNet, or one process")
        return cast("GLocalK", super().fit(train, validation, **kwargs))

    def _train_run(self, device: torch.device, progress: Optional[bool],
                   validate: Optional[Callable[[], float]],
                   first: Optional[TrainResult] = None) -> TrainResult:
        h = self.hparams
        x = self._input.to(device)
        flag = cast(Tensor, self.finetuned)
        flag.fill_(False)
        log = print if self.verbose and nd.is_main() else None
        if log:
            log("GLocal-K stage 1: pre-training (Sparse FC)")
        pre = self._trainer(device, progress).fit(
            x, validate, epochs=None if first is None else self.pretrain_epochs)
        if first is None:
            cast(Tensor, self.pretrain_best_epoch).fill_(pre.best_epoch)
        flag.fill_(True)
        if log:
            log("GLocal-K stage 2: fine-tuning with the global kernel")
        fine = self._trainer(device, progress, epochs=h["global_epochs"],
                             lr=h["global_lr"]).fit(
            x, validate, epochs=None if first is None else first.best_epoch)
        history: List[Dict[str, float]] = [dict(e, stage=1.0) for e in pre.history]
        history += [dict(e, stage=2.0) for e in fine.history]
        return TrainResult(history, fine.best_epoch, fine.best_rmse)


def _too_large(rows: int, width: int) -> str:
    return (f"GLocalK's global kernel convolves the dense training matrix: {rows:,} x "
            f"{width:,} = {rows * width:,} entries is above its limit of "
            f"{MAX_DENSE_ENTRIES:,} (nnsparse.models.glocalk.MAX_DENSE_ENTRIES; "
            f"{4 * MAX_DENSE_ENTRIES / 2**20:.0f} MiB in float32); use KernelNet, which stays "
            f"sparse")
