"""Criteria for sparse targets and denoising autoencoders.

Each wraps an element-wise PyTorch loss (``nn.MSELoss``, ``nn.BCEWithLogitsLoss``,
...) and evaluates it only where it matters: at the specified entries of a
sparse target (:class:`SparseCriterion`, :class:`SDAESparseCriterion`), with
weights on the entries a denoising autoencoder corrupted
(:class:`SDAECriterion`, :class:`SDAESparseCriterion`, :class:`MaskCriterion`).
:func:`prepare_input` lets one training loop serve all of them and any plain loss.
"""
from .mask import MaskCriterion
from .sdae import SDAECriterion, SDAESparseCriterion
from .sparse import SparseCriterion, prepare_input

__all__ = ["SparseCriterion", "SDAECriterion", "SDAESparseCriterion", "MaskCriterion",
           "prepare_input"]
