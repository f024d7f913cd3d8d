"""``torch.load(weights_only=True)`` of whole nnsparse modules and of nnsparse's results.

torch's default ``torch.load`` unpickles only allow-listed globals, and a
whole module (``torch.save(model)``) names its classes.  At import, nnsparse
allow-lists (``torch.serialization.add_safe_globals``) what its own modules
and criteria pickle, and nothing else:

- every ``nn.Module`` class nnsparse defines (layers, criteria, containers);
- the criteria's element-wise loss wrapper and its per-loss functions, with
  the torch loss classes a criterion may wrap (``nn.MSELoss``, ``nn.L1Loss``,
  ... the list nnsparse's criteria compute entry by entry) and
  ``torch.Generator`` (a criterion's noise stream);
- ``SparseLinearBatch(sparse_grad=True)``'s ``state_dict`` hooks, with
  torch's ``_WrappedHook`` that holds them;
- ``DynamicSparseTensor``, whose pickled state is its storage tensors and
  plain settings (a builder saved half-way is read back and extended);
- what a fitted model of ``nnsparse.models`` holds besides its layers: its
  ``RatingNormalizer``, the training ``Ratings`` and the input matrix's parts
  (checked on load as a user's matrix, not trusted), so ``torch.save(model)`` loads whole too (``model.save(path)``, the zoo's
  own format, needs none of this), with ``nn.ModuleList`` that holds
  ``KernelNet``'s layers;
- the corruption mask a denoising criterion keeps from its last
  ``prepare_input``.

- nnsparse's plain results and records, whose unpickling rebuilds their
  fields from values torch already allows (tensors, numbers, strings, lists,
  dicts) and calls nothing else of nnsparse's but ``__new__`` (a checking one:
  ``Recommendations``'), the class itself with its checks, or a ``__setstate__``
  that runs the constructor's checks again (``Ratings``, ``Split``, ``UserSplit``,
  ``CrossValidation``, ``TrainResult``) (see :func:`_data_classes`):
  ``SortResult``, ``TopkResult`` (``ssort`` / ``stopk``), ``Recommendations``,
  ``CrossValidation``, ``TrainResult``, ``Split`` and ``UserSplit`` with its
  ``HeldOut`` pairs (with ``Ratings`` above), ``RatingErrors`` and ``SparseRow``
  (a dataset item; a collate checks a row that is not its dataset's own in full).

Not allow-listed, as their state says "already checked": a
``SparseRowDataset`` (its record of the checked matrices would skip the
check of a file's indices) and a ``SparseRowBatch`` (rebuilt trusted by a
function, for ``DataLoader`` workers).  Save their matrices and build them
again, or load a file you wrote yourself with ``weights_only=False``.  No
optimiser, trainer or dataset class is allowed either.

What a user's model adds (its own class, ``nn.Sequential``, activations, the
function of a ``ValuesMap``) the user allows, as for any torch model:
``torch.serialization.add_safe_globals([MyModel, nn.Sequential])`` or the
``torch.serialization.safe_globals([...])`` context; torch's error names each
missing global.  The way that needs none of this is the ``state_dict``:
``torch.save(model.state_dict(), path)`` then
``model.load_state_dict(torch.load(path))``.
"""
from __future__ import annotations

from typing import Any, Iterator, List

import torch
from torch import nn

__all__: List[str] = []


def _module_classes(root: type) -> Iterator[type]:
    """``root``'s subclasses (transitively) that nnsparse defines."""
    cls: type
    for cls in root.__subclasses__():
        if cls.__module__.split(".")[0] == "nnsparse":
            yield cls
        yield from _module_classes(cls)


def _safe_globals() -> List[Any]:
    from .criteria import _elementwise
    from .layers import linear, sparse_weight
    out: List[Any] = sorted(set(_module_classes(nn.Module)), key=lambda c: c.__qualname__)
    out += [_elementwise.ElementwiseLoss, torch.Generator]
    out += list(_elementwise._KNOWN) + list(_elementwise._KNOWN.values())
    out += [linear._weight_to_state_dict, linear._weight_from_state_dict]
    out.append(sparse_weight._after_load)  # SparseWeightLinear's load_state_dict post-hook
    from .builder import DynamicSparseTensor  # pickles tensors and plain values only
    out.append(DynamicSparseTensor)
    # what a model of the zoo holds besides its layers (torch.save(model) of a fitted one)
    from .data.matrix import RatingNormalizer
    from .data.readers import Ratings
    from .models.base import _CsrParts
    out += [RatingNormalizer, Ratings, _CsrParts]
    from .criteria.sdae import EntryMask  # a denoising criterion's last corruption
    out += [EntryMask, nn.ModuleList]  # ModuleList: KernelNet's layers
    wrapped = getattr(nn.modules.module, "_WrappedHook", None)  # holds a module's hooks
    if wrapped is not None:
        out.append(wrapped)
    return out + _data_classes()


def _data_classes() -> List[type]:
    """nnsparse's results and records that a ``weights_only`` load may rebuild.

    Each is a named tuple or a class without ``__reduce__`` of its own
    (``SparseRow``'s ``__reduce__`` calls the class, which only stores its two
    fields): torch's unpickler makes it with ``cls.__new__`` (or calls the class,
    whose checks then run) and sets its fields from values torch allows, through
    the class's ``__setstate__`` where it has one (the constructor's checks).
    """
    from .data.dataset import SparseRow
    from .data.matrix import RatingErrors
    from .data.split import HeldOut, Split, UserSplit
    from .models.base import Recommendations
    from .models.evaluation import CrossValidation
    from .models.trainer import TrainResult
    from .sort import SortResult, TopkResult
    return [SortResult, TopkResult, Recommendations, CrossValidation, TrainResult, Split,
            UserSplit, HeldOut, RatingErrors, SparseRow]


def register_safe_globals() -> None:
    """Allow-list nnsparse's classes and functions for ``torch.load(weights_only=True)``.

    Called when nnsparse is imported, after every module is defined; call it
    again after defining an ``nn.Module`` subclass in a module named ``nnsparse...``.
    """
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no allow-list (and loads with weights_only=False)
        add(_safe_globals())
