"""Published sparse autoencoders for collaborative filtering, one file each.

* :class:`AutoRec` (Sedhain et al. 2015): I-AutoRec (``orientation="item"``)
  and U-AutoRec (``"user"``);
* :class:`CFN` (Strub, Gaudel & Mary 2016): the denoising CFN, and CFN++ when
  ``fit`` is given side ``features``;
* :class:`KernelNet` (Sparse FC, Muller et al. 2018): kernelised weights;
* :class:`GLocalK` (Han et al. 2021): KernelNet pre-trained, then fine-tuned
  behind a global convolution kernel.

They share :class:`RatingModel` (``fit`` with early stopping and refit,
``predict_entries``, ``evaluate``, ``evaluate_ranking`` (precision, recall, NDCG, hit
rate at k), ``recommend``, ``save``/``load``), the one :class:`Trainer`
(:class:`DistributedTrainer` under ``torchrun``), and :func:`cross_validate`.  See
``docs/models.md`` and ``docs/distributed.md``.
"""
from .trainer import DistributedTrainer, Trainer, TrainResult
from .base import MODELS, RatingModel, Recommendations, register
from .autorec import AutoRec
from .cfn import CFN
from .kernel import KernelNet
from .glocalk import GLocalK
from .evaluation import CrossValidation, cross_validate, fold_files, kfold

__all__ = ["RatingModel", "Recommendations", "Trainer", "DistributedTrainer", "TrainResult",
           "MODELS", "register",
           "AutoRec", "CFN", "KernelNet", "GLocalK", "cross_validate", "CrossValidation", "kfold",
           "fold_files"]
