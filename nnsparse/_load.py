"""``load_state_dict`` that changes nothing when it fails.

torch's ``Module.load_state_dict`` copies every matching entry and reports
size mismatches and missing keys afterwards, so a refused load leaves the
module half loaded.  nnsparse's layers and models check the whole
``state_dict`` first (shapes, tensors, and with ``strict`` the key sets)
and raise torch's ``RuntimeError`` before any copy.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Tuple

import torch
from torch import nn

from ._forms import as_flag

__all__ = ["check_state_dict", "entry_errors"]


def entry_errors(own: Mapping[str, torch.Tensor], state_dict: Mapping[str, Any],
                 prefix: str = "") -> List[str]:
    """torch's messages for the entries of ``state_dict`` (under ``prefix``) that
    cannot be copied into ``own`` (a module's ``state_dict()``): not a tensor, or
    of another shape.  Keys absent from either side are not looked at."""
    errors = []
    for key, current in own.items():
        if prefix + key not in state_dict:
            continue
        given = state_dict[prefix + key]
        if not isinstance(given, torch.Tensor):
            errors.append(f'While copying the parameter named "{prefix}{key}", expected a '
                          f"tensor from checkpoint but received {type(given).__name__}")
        elif given.shape != current.shape:
            errors.append(f"size mismatch for {prefix}{key}: copying a param with shape "
                          f"{given.shape} from checkpoint, the shape in current model is "
                          f"{current.shape}.")
        # torch's copy_ fails on these only once the entries before them are copied
        elif given.layout != current.layout:
            errors.append(f'While copying the parameter named "{prefix}{key}", expected a '
                          f"tensor of layout {current.layout} from checkpoint, got "
                          f"{given.layout}")
        elif given.device.type == "meta" and current.device.type != "meta":
            errors.append(f'While copying the parameter named "{prefix}{key}", expected a '
                          f"tensor that holds data from checkpoint, got a tensor on the meta "
                          f"device")
        # (torch's copy_ drops the imaginary part with a warning only: a silent wrong load)
        elif given.is_complex() and not current.is_complex():
            errors.append(f'While copying the parameter named "{prefix}{key}", expected a '
                          f"real tensor ({current.dtype}) from checkpoint, got {given.dtype}")
    return errors


def check_state_dict(module: nn.Module, state_dict: Any, strict: Any,
                     assign: Any = False) -> Tuple[bool, bool]:
    """Raise ``RuntimeError`` (torch's type and wording) if loading would fail; ``TypeError``
    when ``state_dict`` is no mapping or a flag no bool (torch took ``strict="no"`` as
    true); ``ValueError`` for the pattern of a ``SparseWeightLinear`` inside ``module``
    that is no valid CSR pattern.  Returns ``(strict, assign)`` as bools."""
    strict, assign = as_flag(strict, "strict"), as_flag(assign, "assign")
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of name -> tensor, got "
                        f"{type(state_dict).__name__}")
    # layers inside the module with checks of their own (SparseWeightLinear's pattern):
    # torch runs them in each layer's _load_from_state_dict, after the layers before it
    # were copied
    from .layers.sparse_weight import SparseWeightLinear  # (which imports this module)
    nested = [(f"{name}.", sub) for name, sub in module.named_modules()
              if name and isinstance(sub, SparseWeightLinear)]
    refusals = [m for prefix, sub in nested for m in sub._refusals(state_dict, prefix)]
    if refusals:
        raise RuntimeError(f"Error(s) in loading state_dict for {type(module).__name__}:\n\t"
                           + "\n\t".join(refusals) + "\n(nothing was loaded)")
    own = module.state_dict()
    errors = entry_errors(own, state_dict)
    if strict:
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if unexpected:
            errors.insert(0, "Unexpected key(s) in state_dict: "
                          + ", ".join(f'"{k}"' for k in unexpected) + ". ")
        if missing:
            errors.insert(0, "Missing key(s) in state_dict: "
                          + ", ".join(f'"{k}"' for k in missing) + ". ")
        hint = _wrapper_hint(missing, unexpected)
        if hint:
            errors.append(hint)
    if errors:
        raise RuntimeError(f"Error(s) in loading state_dict for {type(module).__name__}:\n\t"
                           + "\n\t".join(errors) + "\n(nothing was loaded)")
    for prefix, sub in nested:
        sub._check_loaded_pattern(state_dict, prefix)  # ValueError: a pattern that is none
    return strict, assign


_DDP_PREFIX = "module."  # DistributedDataParallel's name of the model it wraps


def _wrapper_hint(missing: List[str], unexpected: List[str]) -> str:
    """The way out when the two key sets differ by DistributedDataParallel's ``module.``
    prefix only (torch lists every key as missing and unexpected), else ``""``."""
    n = len(_DDP_PREFIX)
    if not missing or len(missing) != len(unexpected):
        return ""
    if all(k.startswith(_DDP_PREFIX) for k in unexpected) and \
            sorted(k[n:] for k in unexpected) == sorted(missing):
        return ("(the state_dict of a DistributedDataParallel wrapper, whose keys start with "
                "'module.': save nnsparse.distributed.unwrap(model).state_dict(), or strip the "
                "prefix with torch.nn.modules.utils.consume_prefix_in_state_dict_if_present("
                "state_dict, 'module.'))")
    if all(k.startswith(_DDP_PREFIX) for k in missing) and \
            sorted(k[n:] for k in missing) == sorted(unexpected):
        return ("(the state_dict of an unwrapped model, without DistributedDataParallel's "
                "'module.' prefix: load it into nnsparse.distributed.unwrap(model))")
    return ""
