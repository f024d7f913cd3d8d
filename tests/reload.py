"""The ways a record comes back from storage, for the tests that check a loaded record
runs its constructor's checks (pickle, ``copy.deepcopy``, ``torch.save`` then
``torch.load`` with torch's default ``weights_only`` unpickler, which calls
``__setstate__`` too)."""
import copy
import io
import pickle
from typing import Any

import torch

#: the ``how`` of :func:`reload`, to parametrise a test over
RELOADS = ("pickle", "deepcopy", "torch.load")


def reload(obj: Any, how: str) -> Any:
    """``obj`` pickled and unpickled, deep-copied, or saved and loaded by torch."""
    if how == "pickle":
        return pickle.loads(pickle.dumps(obj))
    if how == "deepcopy":
        return copy.deepcopy(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)
