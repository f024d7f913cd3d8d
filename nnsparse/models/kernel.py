"""Sparse FC (Muller, Martel & Indiveri, ICML 2018): an autoencoder with kernelised weights.

Each weight matrix is ``W * K(U, V)``, an element-wise product with a
finite-support RBF kernel of learnt low-dimensional embeddings of the
layer's inputs ``U`` and outputs ``V``: ``K = max(0, 1 - ||u_j - v_i||^2)``.
Pairs whose embeddings lie far apart get a weight of exactly 0, so the layer
learns which connections to keep.  This is also the local-kernel
pre-training stage of GLocal-K (Han et al., CIKM 2021), whose ML-100K
settings are the defaults here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import sampled_linear, sparse_linear
from .base import RatingModel, register

__all__ = ["KernelNet"]


class _KernelWeight(nn.Module):
    """``W * max(0, 1 - ||v_i - u_j||^2)`` of shape ``(out, in)`` and a bias."""

    def __init__(self, in_features: int, out_features: int, dim: int) -> None:
        super().__init__()
        bound = (6.0 / (in_features + out_features)) ** 0.5  # Glorot uniform, as the paper
        self.weight = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        # tiny embeddings: every connection starts with a kernel value near 1
        self.u = nn.Parameter(torch.randn(in_features, dim).clamp_(-2, 2) * 1e-3)
        self.v = nn.Parameter(torch.randn(out_features, dim).clamp_(-2, 2) * 1e-3)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def kernel(self) -> Tensor:
        # ||v_i - u_j||^2 by one matrix product, no (out, in, dim) intermediate
        dist = (self.v.square().sum(1, keepdim=True) + self.u.square().sum(1)
                - 2.0 * self.v @ self.u.t())
        return torch.clamp(1.0 - dist, min=0.0)


@register
class KernelNet(RatingModel):
    r"""Sparse FC: an I-AutoRec with ``layers`` kernelised sigmoid layers and a kernelised output.

    ``h_1 = sigmoid((W_1 * K_1) r + b_1)``, ..., ``r_hat = (W_o * K_o) h_L + b_o``
    on raw ratings (0 for missing), the first layer a
    :func:`~nnsparse.sparse_linear` of the sparse row, the output a
    :func:`~nnsparse.sampled_linear` at the observed ratings.  Objective:
    ``sum (r - r_hat)^2 + l2 * sum ||W||^2 + l2_kernel * sum ||K||^2``
    (the paper's ``1/2`` on both sides dropped).

    Hyperparameters: ``hidden`` (500), ``layers`` (2), ``dim`` (5, the
    embedding size), ``l2`` and ``l2_kernel``, plus the common ones.  The
    penalties default to ``"auto"``: GLocal-K's MovieLens-100K values (20 and
    0.006) at 80,000 training ratings, times ``(ratings / 80,000) ** 0.4``
    for other sizes (53 and 0.016 at MovieLens-1M's 900,000; the papers
    used 60-70 and 0.013-0.018 there); give numbers to fix them.  The paper
    trains full-batch with L-BFGS; here Adam on mini-batches, like the other
    models (``benchmarks/bench_lbfgs.py`` compares the two).

    Example::

        >>> from nnsparse.data import synthetic_ratings
        >>> r = synthetic_ratings(0, 60, 50, 1200)
        >>> model = KernelNet(hidden=8, epochs=2, validation_ratio=0.0)
        >>> model.fit(r, verbose=False, progress=False).predict(r).shape
        torch.Size([1200])
    """

    name = "sparsefc"
    DEFAULTS = dict(hidden=500, layers=2, dim=5, l2="auto", l2_kernel="auto", batch_size=256)
    # Measured (docs/models.md): the best l2 falls on subsets of MovieLens-100K's folds
    # and rises on a larger synthetic set; the papers' MovieLens-1M values are 3x their
    # MovieLens-100K ones.  The exponent (base class) is below the papers' 0.5: a too
    # large penalty cost more than a too small one in every sweep.
    AUTO = dict(l2=20.0, l2_kernel=0.006)
    raw_input = True
    center = False

    def build(self, rows: int, width: int, features: int) -> None:
        h = self.hparams
        sizes = [width] + [h["hidden"]] * h["layers"] + [width]
        self.kernels = nn.ModuleList(_KernelWeight(a, b, h["dim"])
                                     for a, b in zip(sizes[:-1], sizes[1:]))

    def _layers(self) -> Sequence[_KernelWeight]:
        """``self.kernels`` typed: the ModuleList holds only _KernelWeight layers."""
        self._check_layers("kernels")
        return cast(Sequence[_KernelWeight], self.kernels)

    def output_bias(self) -> Tensor:
        return self._layers()[-1].bias

    def network(self, x: Any, rows: Tensor, pattern: Any = None) -> Any:
        # the kernels are computed once per forward and reused by penalty()
        self._kernels = [layer.kernel() for layer in self._layers()]
        (first, *middle, last), (k_first, *k_middle, k_last) = self._layers(), self._kernels
        h = torch.sigmoid(sparse_linear(x, first.weight * k_first, first.bias))
        for layer, k in zip(middle, k_middle):
            h = torch.sigmoid(F.linear(h, layer.weight * k, layer.bias))
        return sampled_linear(h, last.weight * k_last, last.bias, pattern)

    def __getstate__(self) -> Dict[str, Any]:
        # the last forward's kernels are a cache, and part of its autograd graph after a
        # training step, which copy.deepcopy refuses: a copy computes them again
        state = super().__getstate__()
        state.pop("_kernels", None)
        return state

    def penalty(self) -> Tensor:
        h = self.effective_hparams()
        kernels = getattr(self, "_kernels", None) or [layer.kernel() for layer in self._layers()]
        total: List[Tensor] = []
        for layer, k in zip(self._layers(), kernels):
            total.append(h["l2"] * layer.weight.square().sum()
                         + h["l2_kernel"] * k.square().sum())
        return torch.stack(total).sum()
