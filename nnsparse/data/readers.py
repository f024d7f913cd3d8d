"""Readers for rating files: MovieLens 100K / 1M / 10M, ``ratings.csv`` (and other rating
CSVs of 3 or 4 columns) and plain text.

Every reader returns a :class:`Ratings` record: one entry per rating, with
user and item ids remapped to ``0..n-1`` and the maps from the original ids
kept.  Parsing is vectorised with numpy (one pass over the bytes to count the
fields of each line, one conversion of all tokens), so a 1M-line file reads in
about a second; only a malformed file takes the slow path that finds the first
bad line for the error message.
"""
from __future__ import annotations

import csv
import io
import math
import numbers
import os
import re
import warnings
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, cast

import numpy as np
import torch
from torch import Tensor

from .._forms import _a, _version, as_choice, as_flag, as_tensor, is_int, plain, refuse_meta

__all__ = ["Ratings", "read_ratings", "read_split", "read_item_features", "read_user_features",
           "detect_format", "FORMATS"]

_PathLike = Union[str, "os.PathLike[str]"]

#: format name -> (field separator, fields per line, header line, title file)
_FORMATS: Dict[str, Tuple[Optional[bytes], Tuple[int, int], bool, Optional[str]]] = {
    "ml-100k": (b"\t", (4, 4), False, "u.item"),
    "ml-1m": (b"::", (4, 4), False, "movies.dat"),
    "csv": (b",", (3, 4), True, "movies.csv"),  # 3 or 4, as its first line (_csv_head)
    "text": (None, (3, 4), False, None),
}
#: The file formats :func:`read_ratings` reads (its ``format`` also takes ``"auto"``).
FORMATS: Tuple[str, ...] = tuple(_FORMATS)
#: What ``format=`` takes: ``"auto"`` (detect the format) or one of :data:`FORMATS`.
_CHOICES: Tuple[str, ...] = ("auto",) + FORMATS
#: The largest rating the rating dtype (float32) holds.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The UTF-8 byte order mark some editors put at the start of a text file.
_BOM = b"\xef\xbb\xbf"
#: The first bytes of a file that :func:`_refuse_binary` reads (a NUL among them: a binary
#: file or UTF-16 text, not a stray byte in a text file)
_HEAD = 4096


def _path(path: _PathLike) -> Path:
    """A path given by the caller, ``~`` expanded as the shell and pandas' readers do
    (``"~/data/ml-1m"``; a shell leaves ``--ratings=~/...`` as it is).  A ``~name`` of no
    user stays as it is, a file name (``Path.expanduser`` raised ``RuntimeError``)."""
    return Path(os.path.expanduser(path))


def _float32(values: np.ndarray) -> np.ndarray:
    """``values`` as float32; a value beyond float32's range becomes inf (no warning)."""
    with np.errstate(over="ignore"):
        return values.astype(np.float32)


# Ratings' public fields: an assignment to one after construction is checked
_RATINGS_FIELDS = frozenset({"user", "item", "rating", "user_map", "item_map", "titles",
                             "source"})
#: ... in their order (``==`` compares the cheap ones first)
_RATINGS_ORDER = ("source", "titles", "user_map", "item_map", "user", "item", "rating")
# the constructor's refusals of fields that disagree with one another, by their message's
# start, and those fields (an assignment's refusal says to replace them together): the
# tensors' lengths, the indices against their map, more titles than items
_DISAGREEMENTS = {"Ratings.user, .item and .rating must have one length": "user, item, rating",
                  "Ratings.user indices must be in": "user, user_map",
                  "Ratings.item indices must be in": "item, item_map",
                  "Ratings.titles must hold at most": "item_map, titles"}


@dataclass
class Ratings:
    """A set of ratings: one entry per (user, item, rating) triple.

    Attributes:
        user (Tensor): int64 ``(n,)``, user indices in ``[0, n_users)``.
        item (Tensor): int64 ``(n,)``, item indices in ``[0, n_items)``.
        rating (Tensor): float32 ``(n,)``, the ratings on their original scale.
        user_map (dict): original user id -> index.  Shared (the same object)
            by every part of a split, so all parts have the same shape.
        item_map (dict): original item id -> index, shared likewise.
        titles (list of str, optional): the title of each item index, when an
            item file was read (``"item <id>"`` for ids the file lacks).
        source (str): where the ratings came from, for messages.

    A field assigned after construction (``r.titles = [...]``,
    ``r.rating = r.rating * 2``) is checked as the constructor checks it, with the
    other fields, before the record changes: a refused assignment leaves the record
    as it was.  Fields that must change together (``user`` with ``user_map``, or the
    three tensors to another length) are changed at once by building a new record,
    ``dataclasses.replace(r, user=..., item=..., rating=...)``.  A field cannot be
    deleted.  (Edits inside a field, ``r.item[0] = 7`` or ``r.user_map[id] = 3``,
    are not seen.)  ``==`` compares the values (the tensors of one dtype and device), so
    a record, and a split of records, equals its copy and its reload; records are
    unhashable.

    Raises:
        TypeError: fields of the wrong kind (not 1-D tensors, int64 indices,
            floating ratings, dict maps of int indices, str titles and source),
            at construction or at an assignment.
        ValueError: lengths that differ, indices outside their map, a map that
            is not one index per id over ``0..len(map)-1``, ratings that are not
            finite, tensors on the meta device, at construction or at an assignment.
        AttributeError: ``del`` of a field.

    Example::

        >>> r = Ratings.from_triples([10, 10, 42], [7, 9, 7], [4., 3., 5.])
        >>> r.user, r.item, r.n_users, r.n_items, len(r)
        (tensor([0, 0, 1]), tensor([0, 1, 0]), 2, 2, 3)
        >>> r.user_map
        {10: 0, 42: 1}
        >>> r.rating = torch.tensor([4.5, 3., 5.])  # checked, as the constructor's fields
        >>> r.item = torch.tensor([0, 2, 0])
        Traceback (most recent call last):
            ...
        ValueError: Ratings.item indices must be in [0, 2) (the size of item_map), got min 0, max 2; ...
    """

    user: Tensor
    item: Tensor
    rating: Tensor
    user_map: Dict[Any, int]
    item_map: Dict[Any, int]
    titles: Optional[List[str]] = None
    source: str = ""
    # each map's original ids by index, with the map they were read from (a map replaced
    # by another of the same length, through dataclasses.replace or an assignment, is
    # checked and read again).  Shared by a record's subsets.
    _ids: Dict[str, Tuple[Dict[Any, int], List[Any]]] = field(
        default_factory=dict, repr=False, compare=False)
    # Set when no (user, item) pair is known to repeat (_check_unique_pairs passed, the file
    # reader checked it, or a bool-mask subset of such a record): the user and item
    # tensors then checked and their versions, so that the O(n log n) check runs once
    # per record, and again after either tensor is replaced or edited in place.  Not an
    # __init__ argument: dataclasses.replace() gives a new record no such knowledge.
    # Never set for inference tensors, which count no versions; an edit that bypasses
    # torch's version counter (through .data or a numpy view) is not seen either.
    _unique: Optional[Tuple[Tensor, Tensor, int, int]] = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("user", "item", "rating"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.dim() != 1:
                got = (f"shape {tuple(value.shape)}" if isinstance(value, Tensor)
                       else type(value).__name__)
                raise TypeError(f"Ratings.{name} must be a 1-D tensor, got {got}")
            if value.layout != torch.strided:
                raise TypeError(f"Ratings.{name} must be a dense 1-D tensor, got layout "
                                f"{value.layout}")
            refuse_meta(value, f"Ratings.{name}")
            # a Tensor subclass's results are of its class: the statistics a model or a
            # normaliser keeps would be too, which deepcopy and weights_only loads refuse
            object.__setattr__(self, name, plain(value))  # (not an assignment to check)
        if not (self.user.shape == self.item.shape == self.rating.shape):
            raise ValueError("Ratings.user, .item and .rating must have one length, got "
                             f"{len(self.user)}, {len(self.item)} and {len(self.rating)}")
        for name in ("user", "item"):
            value = getattr(self, name)
            if value.dtype != torch.int64:
                raise TypeError(f"Ratings.{name} must be an int64 tensor of indices, "
                                f"got {value.dtype}")
            if not isinstance(getattr(self, name + "_map"), dict):
                raise TypeError(f"Ratings.{name}_map must be a dict of original id -> index, "
                                f"got {type(getattr(self, name + '_map')).__name__}")
        if not self.rating.is_floating_point():
            raise TypeError(f"Ratings.rating must be a floating-point tensor, "
                            f"got {self.rating.dtype}")
        _check_titles(self.titles, len(self.item_map))
        if not isinstance(self.source, str):
            raise TypeError(f"Ratings.source must be a str, got {type(self.source).__name__}")
        # each map a bijection onto 0..n-1 (checked with its inverse, built once and
        # shared by the subsets): a repeated or missing index lost an id silently
        self.user_ids(), self.item_ids()
        if len(self.rating):  # data preparation, not a training step: one O(n) pass
            for name, bound in (("user", len(self.user_map)), ("item", len(self.item_map))):
                lo, hi = torch.aminmax(getattr(self, name))
                if lo < 0 or hi >= bound:
                    raise ValueError(f"Ratings.{name} indices must be in [0, {bound}) (the "
                                     f"size of {name}_map), got min {int(lo)}, max {int(hi)}")
            if not bool(torch.isfinite(self.rating).all()):
                raise ValueError("Ratings.rating must be finite, got NaN or inf")

    @classmethod
    def from_triples(cls, user: Any, item: Any, rating: Any, source: str = "") -> "Ratings":
        """Ratings from raw ids and values; ids are remapped in sorted order.

        A (user, item) pair may come more than once here; the splits,
        ``fit`` and :func:`~nnsparse.data.rating_matrix` refuse such records.

        Raises:
            TypeError: ids or ratings that are not sequences of ids or numbers.
            ValueError: a None or NaN id (a missing one), ratings that are
                not finite or overflow float32, lengths or shapes that differ.
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        ids = {name: _id_array(v, name) for name, v in (("user", user), ("item", item))}
        if isinstance(rating, Tensor):
            refuse_meta(rating, "rating")
            if rating.layout != torch.strided:
                raise TypeError(f"rating must be a dense tensor or a sequence of numbers, got "
                                f"layout {rating.layout}")
            if rating.dtype == torch.bool:
                raise TypeError("rating must be a sequence of real numbers, got a bool tensor")
            if rating.is_complex():  # numpy would drop the imaginary parts
                raise TypeError(f"rating must be a sequence of real numbers, got a "
                                f"{rating.dtype} tensor")
        else:
            _refuse_non_numbers(rating, "rating")
        try:
            wide = np.asarray(_host(rating) if isinstance(rating, Tensor) else rating,
                              dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise TypeError(f"rating must be a sequence of real numbers ({e})") from None
        if wide.ndim != 1:
            raise ValueError(f"rating must be 1-D, one value per (user, item), "
                             f"got shape {wide.shape}")
        if not np.isfinite(wide).all():
            bad = wide[~np.isfinite(wide)][0]
            raise ValueError(f"rating must be finite, got {bad}")
        values = _float32(wide)
        if not np.isfinite(values).all():
            k = int(np.flatnonzero(~np.isfinite(values))[0])
            raise ValueError(f"rating must fit the rating dtype float32 (at most "
                             f"{_FLOAT32_MAX:.4g} in size), got {wide[k]:g} at position {k}")
        users, user_index = _remap(ids["user"], None, "user")
        items, item_index = _remap(ids["item"], None, "item")
        return cls(torch.from_numpy(user_index), torch.from_numpy(item_index),
                   torch.from_numpy(values), users, items, source=source)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field assigned after construction: the constructor's checks on a record with
        the new value (``dataclasses.replace``), and only then this record changed."""
        if name not in _RATINGS_FIELDS or name not in self.__dict__:
            object.__setattr__(self, name, value)  # __init__'s first assignment, a cache
            return
        try:
            checked = replace(self, **{name: value}, _ids=dict(self._ids))
        except ValueError as e:
            fields = [f for start, f in _DISAGREEMENTS.items() if str(e).startswith(start)]
            if not fields:
                raise  # (a value wrong on its own: NaN ratings, a map of repeated indices)
            together = ", ".join(f"{f}=..." for f in fields[0].split(", "))
            raise ValueError(f"{e}; to change fields that must agree together, build a new "
                             f"record: dataclasses.replace(ratings, {together})") from None
        object.__setattr__(self, name, getattr(checked, name))  # (plain(), as __init__)
        if name.endswith("_map"):
            key = name[:-len("_map")]
            if key in checked._ids:
                self._ids[key] = checked._ids[key]

    def __delattr__(self, name: str) -> None:
        if name in _RATINGS_FIELDS:
            raise AttributeError(f"Ratings.{name} cannot be deleted (a record has every field); "
                                 f"build a new record with dataclasses.replace(ratings, "
                                 f"{name}=...)")
        object.__delattr__(self, name)

    def __setstate__(self, state: Any) -> None:
        """Unpickling (``torch.load``, ``copy``, a worker's record): the fields checked again
        as the constructor checks them, the caches (``_ids``, ``_unique``) dropped.  A file
        must not give a record unchecked indices (a negative one reached a trusted matrix,
        and a kernel's memory) nor claim its pairs or maps already checked."""
        if not isinstance(state, dict):
            raise TypeError(f"Ratings state must be a dict of fields, got {type(state).__name__}")
        self.__dict__.update(state)
        self._ids, self._unique = {}, None
        self.__post_init__()

    def __eq__(self, other: object) -> bool:
        """The same ratings: ``user``, ``item`` and ``rating`` of one dtype, device and
        shape with equal values, equal maps, titles and source (the caches aside).  A
        record equals its copy and its reload (``torch.load``); it is unhashable, as a
        dataclass that is not frozen."""
        return cast(bool, _records_equal(self, other, _RATINGS_ORDER))

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return self.rating.shape[0]

    def __repr__(self) -> str:
        """A summary: the sizes, not the data.  The dataclass's repr printed both id maps
        and every title in full (tens of thousands of entries for MovieLens-1M), and a
        :class:`Split`'s three times over.  Reads no tensor data (no sync on CUDA)."""
        try:  # never raises (a repr runs in tracebacks): a field assigned something else
            device = ("" if self.rating.device.type == "cpu"
                      else f", device='{self.rating.device}'")
            titles = "None" if self.titles is None else f"<{len(self.titles)} titles>"
            return (f"{type(self).__name__}(ratings={len(self)}, n_users={self.n_users}, "
                    f"n_items={self.n_items}, dtype={self.rating.dtype}{device}, "
                    f"titles={titles}, source={self.source!r})")
        except Exception:  # (a __post_init__ that refused its fields, r.rating = [...])
            return f"<{type(self).__name__} with unchecked fields>"

    @property
    def n_users(self) -> int:
        return len(self.user_map)

    @property
    def n_items(self) -> int:
        return len(self.item_map)

    @property
    def scale(self) -> Tuple[float, float]:
        """``(min, max)`` of the ratings (reads the data: a sync on CUDA)."""
        if len(self) == 0:
            raise ValueError(f"ratings{_from(self.source)} are empty; they have no scale")
        lo, hi = torch.aminmax(self.rating.detach())
        return float(lo), float(hi)

    def user_ids(self) -> List[Any]:
        """The original user id of each user index."""
        return self._inverse("user", self.user_map)

    def item_ids(self) -> List[Any]:
        """The original item id of each item index."""
        return self._inverse("item", self.item_map)

    def _inverse(self, key: str, mapping: Dict[Any, int]) -> List[Any]:
        cached = self._ids.get(key)
        if cached is not None and cached[0] is mapping and len(cached[1]) == len(mapping):
            return cached[1]
        _check_map(mapping, f"Ratings.{key}_map")
        ids: List[Any] = [None] * len(mapping)
        for original, index in mapping.items():
            ids[index] = original
        self._ids[key] = (mapping, ids)
        return ids

    def _known_unique(self) -> bool:
        """Whether this record's (user, item) pairs are known not to repeat (see ``_unique``)."""
        known = self._unique
        if known is not None and not (known[0] is self.user and known[1] is self.item and
                                      known[2:] == (_version(self.user), _version(self.item))):
            known = self._unique = None  # stale: the tensors changed (and need not stay alive)
        return known is not None

    def _mark_unique(self) -> None:
        """Record that no (user, item) pair of this record repeats (checked by the caller)."""
        if self.user.is_inference() or self.item.is_inference():
            return  # no version counter (torch.inference_mode): an edit would go unseen
        self._unique = (self.user, self.item, _version(self.user), _version(self.item))

    def subset(self, index: Any) -> "Ratings":
        """The entries ``index``, sharing the maps and titles.

        Args:
            index: int64 (or int32) entry indices in ``[-n, n)``, or a bool
                mask of shape ``(n,)``; a tensor, a numpy array or a list.

        Raises:
            TypeError: a float index, or a uint8 one (torch reads uint8 as a
                mask, a use it deprecates: pass ``.long()`` or ``.bool()``), or a
                bool among a list's ints (torch reads ``True`` as 1), a str, bytes or
                bytearray (not a sequence of indices).
            ValueError: an index that is not 1-D, a mask of another length.
            IndexError: an index outside ``[-n, n)`` (a uint64 one of ``2**63`` or
                more named as it is, not wrapped negative; an int of a list beyond
                int64 too).
        """
        index = _entry_index(index, len(self))
        part = replace(self, user=self.user[index], item=self.item[index],
                       rating=self.rating[index], _ids=self._ids)
        if index.dtype == torch.bool and self._known_unique():
            part._mark_unique()  # a mask keeps each entry at most once (indices may repeat)
        return part

    def rated_in(self, other: "Ratings") -> Tensor:
        """A bool mask of these ratings whose (user, item) pair ``other`` rates too.

        ``self.subset(~self.rated_in(other))`` keeps the test ratings a
        ranking can score: one that the training ratings rate too is
        left out of each user's candidates, so it could never be a hit
        (:func:`read_split` warns of such pairs).

        Args:
            other (Ratings): indexing the ids of these ratings as they do
                (extra ids may follow): the parts of one split, or of
                :func:`read_split`, share their maps.

        Returns:
            bool ``(len(self),)``, on the ratings' device.

        Raises:
            TypeError: ``other`` is not a :class:`Ratings`.
            ValueError: ``other`` indexes an id of these ratings otherwise, or is on
                another device.

        Example::

            >>> r = Ratings.from_triples([1, 1, 2, 2], [10, 20, 10, 20], [4., 3., 5., 1.])
            >>> train, test = r.subset([0, 1, 2]), r.subset([3, 1])  # (maps shared)
            >>> test.rated_in(train)  # train rates (user 1, item 20), not (2, 20)
            tensor([False,  True])
            >>> test.subset(~test.rated_in(train)).rating
            tensor([1.])
        """
        _check_ratings(other, "other")
        from .matrix import _check_same_maps  # (matrix imports this module)
        _check_same_maps(other, self, "other", "this record")
        if other.user.device != self.user.device:
            raise ValueError(f"other must be on this record's device {self.user.device}, got "
                             f"{other.user.device}")
        (ours, theirs), _ = _pair_keys(self, other)
        return torch.isin(ours, theirs)


def _refuse_uint8_index(index: Tensor, name: str, expected: str, fix: str) -> None:
    """Refuse a uint8 ``index``: torch indexing reads uint8 as a mask (a use it
    deprecates), so ``[1, 1, 1]`` would pick three entries, not one entry three times."""
    if index.dtype == torch.uint8:
        raise TypeError(f"{name} must be {expected}, got torch.uint8, which torch would read "
                        f"as a mask; convert it with {fix}")


def _refuse_bool_among_ints(value: Any, name: str, expected: str) -> None:
    """Refuse a list or tuple ``value`` holding a bool (Python, numpy or a 0-d tensor)
    among its ints: ``torch.as_tensor([3, True])`` is ``[3, 1]``, the bool read as 1.
    Bools only (a mask, where one is taken) and other values pass."""
    if isinstance(value, (list, tuple)):
        bools = [isinstance(v, (bool, np.bool_)) or (isinstance(v, Tensor) and
                                                     v.dtype == torch.bool) for v in value]
        if any(bools) and not all(bools):
            n = bools.index(True)
            raise TypeError(f"{name} must hold {expected}, got {name}[{n}] = {value[n]!r}, "
                            f"a bool")


def _index_tensor(value: Tensor, name: str, dense: str, integer: str, one_d: str,
                  uint8: Tuple[str, str], no_bool: Optional[str] = None) -> Tensor:
    """The checks of an index tensor that :func:`_entry_index` and :func:`_distinct_index`
    share, in one order, in their words: strided ("``name`` must be ``dense``, got layout
    ..."), not uint8 (:func:`_refuse_uint8_index` with ``uint8``, the kind expected and
    the fix), not bool where ``no_bool`` (its message) is given, not floating or complex
    ("``name`` must ``integer`` <dtype>"), not meta, 1-D ("``name`` must be 1-D
    (``one_d``), got shape ..."); an int8 or int16 tensor made int64 (torch indexes with
    neither)."""
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be {dense}, got layout {value.layout}")
    _refuse_uint8_index(value, name, *uint8)
    if no_bool is not None and value.dtype == torch.bool:
        raise TypeError(no_bool)
    if value.is_floating_point() or value.is_complex():
        raise TypeError(f"{name} must {integer} {value.dtype}")
    refuse_meta(value, name)  # its indices cannot be read
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D ({one_d}), got shape {tuple(value.shape)}")
    if value.dtype not in (torch.bool, torch.int32, torch.int64):
        value = value.long()
    return value


def _beyond_int64(value: Any) -> Optional[int]:
    """The first int of a list or tuple ``value`` outside int64's range (which
    ``torch.as_tensor`` refuses: an index out of range, not a wrong kind), or None."""
    if not isinstance(value, (list, tuple)):
        return None
    return next((int(v) for v in value if is_int(v) and not -2 ** 63 <= int(v) < 2 ** 63),
                None)


def _uint64_beyond(given: Tensor) -> Optional[int]:
    """The first index of a uint64 tensor ``given`` that is ``2**63`` or more, which
    ``.long()`` (:func:`_index_tensor`) wraps negative (``2**64 - 1`` read as ``-1``), or
    None (another dtype, or none such)."""
    if given.dtype != torch.uint64 or not given.numel():
        return None
    wrapped = given.view(torch.int64)
    if not bool((wrapped < 0).any()):
        return None
    return int(wrapped[wrapped < 0][0]) + 2 ** 64


def _entry_index(index: Any, n: int) -> Tensor:
    """``index`` checked as entry indices in ``[-n, n)`` or a bool mask of ``n`` entries."""
    if not isinstance(index, Tensor):
        if isinstance(index, (str, bytes, bytearray)):  # (a bytearray's bytes read as ints)
            raise TypeError(f"index must be an integer or bool tensor, got "
                            f"{type(index).__name__}")
        _refuse_bool_among_ints(index, "index", "integer entry indices or bools only (a mask)")
        try:
            index = as_tensor(index)  # (np.flip(a) too: copied)
        except (TypeError, ValueError, RuntimeError):
            huge = _beyond_int64(index)  # a value out of range, not a wrong kind
            if huge is not None:
                raise IndexError(f"index must be in [-{n}, {n}) (entries of {n} ratings), "
                                 f"got {huge}") from None
            raise TypeError(f"index must be an integer or bool tensor, got "
                            f"{type(index).__name__}") from None
        if index.numel() == 0:  # [] reads as float32: keep nothing
            index = index.long()
    checked = _index_tensor(index, "index", "a dense integer or bool tensor",
                            "be an integer or bool tensor, got", "entries to keep",
                            ("int64 indices or a bool mask",
                             ".long() (indices) or .bool() (a mask)"))
    beyond = _uint64_beyond(index)  # (2**64 - 1 read as -1 took the last entry)
    if beyond is not None:
        raise IndexError(f"index must be in [-{n}, {n}) (entries of {n} ratings), got {beyond}")
    if checked.dtype == torch.bool:
        if checked.shape != (n,):
            raise ValueError(f"index must have shape ({n},) as a bool mask, "
                             f"got {tuple(checked.shape)}")
        return checked
    if checked.numel():
        lo, hi = (int(v) for v in torch.aminmax(checked))
        if lo < -n or hi >= n:
            raise IndexError(f"index must be in [-{n}, {n}) (entries of {n} ratings), got "
                             f"{lo if lo < -n else hi}")
    return checked


def _distinct_index(value: Any, name: str, bound: int, what: str) -> Tuple[Tensor, Tensor]:
    """``(index, order)``: ``value`` checked as distinct ``what`` indices in ``[0, bound)``,
    and the permutation that sorts it (``index[order]`` ascending), for :func:`_positions`.

    ``index``: a 1-D integer tensor (int64 when int8 or int16, which torch does not index
    with; kept on its device) or a sequence (a list, a tuple, a range, a numpy array) of
    ints, made an int64 CPU tensor; ``order`` int64 on its device.  ``TypeError`` for
    another kind, a float, bool or uint8 dtype (torch would read uint8 as a mask), a bool
    among a list's ints (torch reads ``True`` as 1); ``ValueError`` for another shape than
    1-D, an index out of range (a uint64 one of 2**63 or more named as it is, not wrapped
    negative) or one given twice
    (one host sync and one sort of ``value``, O(len(value) log len(value)), whose
    permutation is ``order``: the positions need no second sort)."""
    expected = f"a 1-D integer tensor or a sequence of ints ({what} indices)"
    if not isinstance(value, Tensor):
        # (a bytearray is a byte string as bytes is, not a list of indices)
        if isinstance(value, (str, bytes, bytearray)) or not hasattr(value, "__len__"):
            raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
        # (a list of bools only is a mask, refused below with its fix)
        _refuse_bool_among_ints(value, name, f"integer {what} indices")
        if isinstance(value, np.ndarray) and value.dtype.kind == "u" and value.size \
                and int(value.max()) >= 2 ** 63:  # (torch's int64 would wrap it negative)
            raise ValueError(f"{name} must be {what} indices in [0, {bound}), got "
                             f"{int(value.max())}")
        try:
            value = as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            huge = _beyond_int64(value)  # a value out of range, not a wrong kind
            if huge is not None:
                raise ValueError(f"{name} must be {what} indices in [0, {bound}), got "
                                 f"{huge}") from None
            raise TypeError(f"{name} must be {expected}, got {type(value).__name__} "
                            f"{value!r}") from None
        if value.numel() == 0:  # [] reads as float32: no index
            value = value.long()
    # (a bool tensor is never read as a mask: its True places are the indices)
    given = value
    value = _index_tensor(value, name, expected, f"hold integer {what} indices, got dtype",
                          f"{what} indices", (f"int64 {what} indices", ".long()"),
                          no_bool=f"{name} must hold integer {what} indices, got dtype "
                                  f"torch.bool; for the {what}s of a mask, pass "
                                  f"mask.nonzero().squeeze(1)")
    beyond = _uint64_beyond(given)
    if beyond is not None:
        raise ValueError(f"{name} must be {what} indices in [0, {bound}), got {beyond}")
    ordered, order = torch.sort(value)
    if value.numel():
        # twice[i]: ordered[i] is also ordered[i + 1]; the first such place by argmax
        twice = torch.cat([ordered[1:] == ordered[:-1], ordered.new_zeros(1, dtype=torch.bool)])
        first = twice.to(torch.int8).argmax()
        # one host sync: the extremes, whether an index repeats and the first that does
        lo, hi, repeats, repeated = torch.stack(
            [ordered[0], ordered[-1], twice.any().to(ordered.dtype), ordered[first]]).tolist()
        if lo < 0 or hi >= bound:
            raise ValueError(f"{name} must be {what} indices in [0, {bound}), got "
                             f"{lo if lo < 0 else hi}")
        if repeats:
            raise ValueError(f"{name} must hold each {what} once, got {what} {repeated} twice")
    return cast(Tensor, value), order


def _positions(listed: Tensor, order: Tensor, wanted: Tensor,
               bound: int) -> Tuple[Tensor, Tensor]:
    """``(position, found)``: for each index of ``wanted``, its position in ``listed``
    (distinct indices in ``[0, bound)``, sorted by ``order``: :func:`_distinct_index`'s
    pair, on ``wanted``'s device) and whether ``listed`` holds it at all (``position``
    0 where not), for ``rating_matrix``'s ``rows=`` and ``ranking_metrics``' ``users=``.

    A table of ``bound`` positions where it is no larger than the indices to place
    (``bound <= len(listed) + len(wanted)``: O(len(listed) + len(wanted)), 0.1 s for 10M
    entries in 100k rows where the search took 1.0 s, 1 thread), else a binary search in
    ``listed[order]``, O(len(listed) + len(wanted) log len(listed)): no sort, and no
    work of the id map's size beyond the indices given."""
    if listed.numel() == 0:
        return (torch.zeros_like(wanted),
                torch.zeros(wanted.shape, dtype=torch.bool, device=wanted.device))
    if bound <= listed.numel() + wanted.numel():
        table = torch.full((bound,), -1, dtype=torch.int64, device=wanted.device)
        table[listed] = torch.arange(listed.numel(), device=wanted.device)
        # (an index outside [0, bound), in a tensor edited in place since it was checked,
        # is not found)
        position = table[wanted.clamp(0, bound - 1)]
        found = (position >= 0) & (wanted >= 0) & (wanted < bound)
        return position.clamp_(min=0), found
    ordered = listed[order]
    at = torch.searchsorted(ordered, wanted).clamp_(max=ordered.numel() - 1)
    return order[at], ordered[at] == wanted


def _isin_argument(value: Any, name: str, device: torch.device) -> str:
    """``name``'s value (``rows=`` or ``users=`` as given) written as the tensor on ``device``
    that ``torch.isin`` needs in a refusal's fix (a list, a range or a numpy array it
    refuses)."""
    if isinstance(value, Tensor):
        return name if value.device == device else f"{name}.to('{device}')"
    if device.type == "cpu":
        return f"torch.as_tensor({name})"
    return f"torch.as_tensor({name}, device='{device}')"


def _check_unique_pairs(name: str, *parts: Ratings) -> None:
    """``ValueError`` when the ratings of ``parts`` (sharing one pair of id maps) together
    rate a (user, item) pair more than once.

    One sort of the ``n`` pair keys, O(n log n) (about 0.5 s for 10M ratings on
    one CPU thread), skipped for one part already known unique
    (``Ratings._known_unique``); each part is marked unique once it passes.
    The message names ``name`` (and the source), the number of repeated pairs
    and the original ids of the first.
    """
    first = parts[0]
    if len(parts) == 1 and first._known_unique():
        return
    key, width = _sorted_pair_keys(*parts)
    _refuse_repeated_keys(f"{name}{_from(first.source)}", first, key,
                          lambda k: divmod(k, width))
    for part in parts:  # no pair repeats in all the parts together, nor in each one
        part._mark_unique()


def _pair_keys(*parts: Ratings) -> Tuple[List[Tensor], int]:
    """``(keys, width)``: the ``user * width + item`` key of each rating, a tensor per part
    of ``parts`` (one pair of id maps), ``width`` the items of the largest map."""
    width = max(p.n_items for p in parts)
    return [p.user * width + p.item for p in parts], width


def _sorted_pair_keys(*parts: Ratings) -> Tuple[Tensor, int]:
    """``(keys, width)``: the sorted :func:`_pair_keys` of the ratings of ``parts``
    together."""
    keys, width = _pair_keys(*parts)
    return torch.sort(keys[0] if len(keys) == 1 else torch.cat(keys))[0], width


def _check_unique_pairs_apart(name: str, ratings: Ratings, together: str,
                              other: Ratings) -> None:
    """:func:`_check_unique_pairs` of ``ratings`` and of ``ratings`` with ``other``
    together, in one sort when no pair repeats; ``ratings`` alone is named when
    the repeat is its own."""
    try:
        _check_unique_pairs(together, ratings, other)
    except ValueError:
        _check_unique_pairs(name, ratings)
        raise


def _refuse_repeated_keys(who: str, ratings: Ratings, key: Tensor,
                          pair_of: Callable[[int], Tuple[int, int]]) -> None:
    """``ValueError`` when the sorted pair keys ``key`` repeat one: ``who`` (the
    argument), how many pairs and the ids of the first (``pair_of(key)`` is its
    ``(user, item)`` index in ``ratings``' maps) with its number of ratings."""
    pairs, repeated = _repeated_keys(key)
    if pairs:
        user, item = pair_of(repeated)
        times = int((key == repeated).sum())
        raise ValueError(_repeats_message(who, pairs, ratings.user_ids()[user],
                                          ratings.item_ids()[item], f"{times} ratings"))


def _repeated_keys(key: Tensor) -> Tuple[int, int]:
    """``(pairs, first)`` of a sorted key tensor: how many distinct keys occur more
    than once, and the smallest of them (``-1`` when none repeats).  One host sync
    when none does."""
    if key.numel() < 2:
        return 0, -1
    same = key[1:] == key[:-1]
    if not bool(same.any()):
        return 0, -1
    repeated = key[1:][same]
    return 1 + int((repeated[1:] != repeated[:-1]).sum()), int(repeated[0])


def _repeats_message(who: str, pairs: int, user: Any, item: Any, where: str) -> str:
    """The one message of (user, item) pairs rated more than once (``who``: the
    argument or file, ``where``: how often or on which lines the example pair is)."""
    return (f"{who}: {pairs} (user, item) pair{'s' if pairs != 1 else ''} rated more than "
            f"once, e.g. user {user!r} and item {item!r} ({where}); keep one rating per pair")


def _same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` hold the same values, for the records' ``==`` (:class:`Ratings`, the
    splits, :class:`~nnsparse.models.Recommendations`, ``TrainResult``, ``CrossValidation``):
    tensors of one dtype, device, layout and shape with equal values (``torch.equal``, NaN
    at the same places equal: a record equals its copy and its reload), numbers equal or
    both NaN (``TrainResult.best_rmse`` without validation), lists, tuples and dicts item
    by item, anything else by ``==``.  Tensors' own ``==`` is elementwise: the
    dataclass's and the tuple's ``==`` raised "Boolean value of Tensor with more than one
    value is ambiguous".  Sparse tensors compare their coalesced COO indices and values
    (a CSR tensor equals its copy, an uncoalesced one its coalesced form; nothing
    densified).  Meta tensors (no values to read) are the same only when they are one
    tensor."""
    if a is b:
        return True
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or (
                a.dtype, a.device, a.layout, a.shape) != (b.dtype, b.device, b.layout, b.shape):
            return False
        if a.device.type == "meta":
            return False
        if a.layout != torch.strided:  # (torch.equal has no sparse kernel: it raised)
            a, b = (a.to_sparse(layout=torch.sparse_coo).coalesce(),
                    b.to_sparse(layout=torch.sparse_coo).coalesce())
            return _same(a.indices(), b.indices()) and _same(a.values(), b.values())
        if torch.equal(a, b):
            return True
        if a.is_complex():  # (a NaN part in the same place: isnan is either part's)
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        try:  # (an id map: C's dict ==, without a Python call per id)
            if a == b:
                return True
        except (RuntimeError, TypeError, ValueError):  # (a tensor or array value)
            pass
        return all(_same(a[key], b[key]) for key in a)
    if (isinstance(a, numbers.Real) and isinstance(b, numbers.Real)
            and not isinstance(a, (bool, np.bool_)) and not isinstance(b, (bool, np.bool_))):
        return bool(a == b or (a != a and b != b))  # (math.isnan overflowed on 10**400)
    return bool(a == b)


def _records_equal(record: Any, other: Any, fields: Any) -> Any:
    """``record == other`` for a record whose ``fields`` hold tensors or NaN
    (:func:`_same` field by field); ``NotImplemented`` for another class, as a
    dataclass's ``==``."""
    if type(other) is not type(record):
        return NotImplemented
    return all(_same(getattr(record, name), getattr(other, name)) for name in fields)


def _check_ratings(ratings: Any, name: str) -> None:
    """``TypeError`` unless ``ratings`` is a :class:`Ratings` record."""
    if not isinstance(ratings, Ratings):
        raise TypeError(f"{name} must be a Ratings record (from read_ratings or "
                        f"Ratings.from_triples), got {type(ratings).__name__}")


def _check_titles(titles: Any, n_items: int) -> None:
    """``Ratings.titles``: None or a list of str, one per item index; fewer than the items
    when the shared ``item_map`` grew since (a later file added items, which have none)."""
    if titles is None:
        return
    if not isinstance(titles, (list, tuple)):
        raise TypeError(f"Ratings.titles must be None or a list of str (one per item), "
                        f"got {type(titles).__name__}")
    bad = [t for t in titles if not isinstance(t, str)]
    if bad:
        raise TypeError(f"Ratings.titles must be None or a list of str (one per item), "
                        f"got {_a(type(titles).__name__)} holding {type(bad[0]).__name__}")
    if len(titles) > n_items:
        raise ValueError(f"Ratings.titles must hold at most one title per item of item_map "
                         f"({n_items}), got {len(titles)}")


def _from(source: str) -> str:
    return f" from {source}" if source else ""


# -- tokenising ---------------------------------------------------------------------

_SPACE = np.zeros(256, dtype=bool)
_SPACE[[9, 10, 11, 12, 13, 32]] = True  # what bytes.split() splits on


class _Tokens:
    """The whitespace-separated tokens of ``raw`` (``raw.split()``'s), kept as offsets into
    it: ``tokens[k]`` is one token's bytes, :meth:`pick` some tokens as one numpy bytes
    array, with no Python object per token (``raw.split()`` made 4 a line of a rating file:
    about 215 bytes a line, half the peak memory of reading a large ratings.csv)."""

    #: tokens gathered at a time by :meth:`pick`, at most (its index temporary: ``_CHUNK``
    #: x width int64), and the bytes a gather takes at most: fewer tokens at a time when a
    #: token is long (a 5000-byte id in a 20000-line file took 1.8 GB, 0.3 GB before)
    _CHUNK = 1 << 16
    _CHUNK_BYTES = 1 << 19

    def __init__(self, raw: bytes, buf: np.ndarray, starts: np.ndarray,
                 ends: np.ndarray) -> None:
        # (numpy's bytes arrays drop a token's trailing NULs: :func:`_refuse_nul` refuses a
        # rating file holding one before it is tokenised)
        self.raw, self.buf, self.starts, self.ends = raw, buf, starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k: Any) -> bytes:
        return self.raw[int(self.starts[k]):int(self.ends[k])]

    def pick(self, index: np.ndarray) -> np.ndarray:
        """``np.array([self[k] for k in index])``: dtype ``S<longest token>``, gathered from
        the bytes ``_CHUNK`` tokens at a time."""
        if len(index) == 0:
            return np.array([], "S1")
        start = self.starts[index]
        length = self.ends[index] - start
        width = int(length.max())
        out = np.empty((len(index), width), dtype=np.uint8)
        offsets = np.arange(width)
        last = len(self.buf) - 1
        chunk = max(1, min(self._CHUNK, self._CHUNK_BYTES // width))
        for a in range(0, len(index), chunk):
            block = self.buf[np.minimum(start[a:a + chunk, None] + offsets, last)]
            block[offsets >= length[a:a + chunk, None]] = 0
            out[a:a + chunk] = block
        return out.view(f"S{width}").reshape(-1)


def _tokenise(raw: bytes, path: str, fields: Tuple[int, int], header: bool,
              original: Optional[bytes] = None, fmt: Optional[str] = None, why: str = ""
              ) -> Tuple[_Tokens, np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Split ``raw`` (separators already turned into spaces) into tokens.

    Returns the tokens, the index of the first token of each record, the
    1-based line number of each record and which tokens hold a ``_`` (None
    when none does).  Blank lines are skipped; a line with a wrong number of
    fields raises ``ValueError`` with its number, quoted from ``original`` (the
    bytes before the separators were replaced; default ``raw``) as the file holds it,
    then ``why`` (where the count comes from) unless it is the first line, and a hint
    when the line is one of another format than ``fmt``.  A line holding a lone
    ``'\\r'`` between two fields' characters (a file whose lines end in ``'\\r'``
    alone, or one such line) raises ``ValueError`` too, whatever its field count.
    """
    buf = np.frombuffer(raw, dtype=np.uint8)
    space = _SPACE[buf]
    starts = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))
    newlines = np.flatnonzero(buf == 10)
    line_of_token = np.searchsorted(newlines, starts)  # 0-based line of each token
    n_lines = len(newlines) + 1
    counts = np.bincount(line_of_token, minlength=n_lines)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    written = np.flatnonzero(counts)  # the non-blank lines, the header's too
    lines = written
    only = "empty file"
    if header and len(lines):
        lines = lines[1:]
        only = "a header line and no rating line"
    lo, hi = fields
    bad = lines[(counts[lines] < lo) | (counts[lines] > hi)]
    joined = _first_lone_cr(raw, buf, newlines)

    def shown(number: int) -> str:
        """Line ``number`` (0-based) as the file holds it: '1::10::4', not the tokeniser's
        '1 10 4' (a one-byte separator keeps the offsets, '::' does not: its own newlines
        then, found only for a refusal)."""
        text = raw if original is None else original
        return _line(text, newlines if text is raw or len(text) == len(raw) else
                     np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 10), number)

    if len(bad) and (joined is None or int(bad[0]) <= joined):
        number = int(bad[0])
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        line = shown(number)
        why = why if number != int(written[0]) else ""
        if _lone_cr(raw, newlines, number):
            why += "; " + _LONE_CR
        raise ValueError(f"{path}, line {number + 1}: expected {want} fields, got "
                         f"{counts[number]}: {_quote(line)}{why}{_other_format(line, fmt)}")
    # A file whose lines end in a lone '\r' is one line, of as many fields as its lines
    # hold: 2 and 5 or more whitespace-free lines fail the count above, with the hint,
    # but 3 or 4 ('1::10::4::1\r2::20::3::1\r3::30::5::1', detected as 'text' from that
    # one line) pass it as one rating, and failed on its 'rating' '3::30::5::1' with no
    # word why.  So does a lone '\r' on a later line (an edit of the file on a Mac, two
    # files joined): '2 20\r3 30' read as user 2, item 20, rating 3, silently.  The
    # first line that holds one is named (before a line of a wrong count after it).
    if joined is not None:
        number = joined
        raise ValueError(f"{path}, line {number + 1}: expected lines ending in '\\n' (or "
                         f"'\\r\\n'), got {_quote(shown(number))}; "
                         f"{_LONE_CR}")
    if len(lines) == 0:
        raise ValueError(f"{path} holds no ratings ({only})")
    ends = np.flatnonzero(~space & np.concatenate((space[1:], [True]))) + 1
    return _Tokens(raw, buf, starts, ends), first[lines], lines + 1, _underscored(buf, starts)


def _first_lone_cr(raw: bytes, buf: np.ndarray, newlines: np.ndarray) -> Optional[int]:
    """The first line (0-based) of ``raw`` (``buf``: its bytes as uint8, ``newlines``: the
    offsets of its ``'\\n'``) that holds a lone ``'\\r'`` (:func:`_lone_cr`), or None.
    One comparison of the bytes, and numpy's look at each ``'\\r'`` (a CRLF file's are
    beside its newlines); a line is read only where a ``'\\r'`` of it lies between two
    bytes that are no ASCII space, which :func:`_lone_cr` then judges."""
    cr = np.flatnonzero(buf == 13)
    if len(cr) == 0:
        return None
    # a run of '\r' that ends before a field's byte and starts after one (the byte before
    # it, or a longer run's '\r')
    cr = cr[(cr + 1 < len(buf)) & (cr > 0)]
    cr = cr[~_SPACE[buf[cr + 1]]]
    before = buf[cr - 1]
    cr = cr[(before == 13) | ~_SPACE[before]]
    checked = -1
    for number in np.searchsorted(newlines, cr).tolist():
        if number != checked and _lone_cr(raw, newlines, number):
            return int(number)
        checked = number
    return None


#: a '\r' (or a run of them: blank lines) with no space on either side: no ASCII
#: whitespace, what the tokeniser splits at (a str pattern's Unicode spaces, a no-break
#: space beside the '\r', hid the joined line the tokeniser reads)
_JOINED_BYTES = re.compile(rb"[^\s]\r+[^\s]")
#: The hint of a refusal of a line holding such a '\r' (:func:`_lone_cr`)
_LONE_CR = ("it holds a '\\r' with no newline after it: a file whose lines end in '\\r' "
            "alone (classic Mac OS) reads as one line; convert them to '\\n'")


def _lone_cr(raw: bytes, newlines: np.ndarray, number: int) -> bool:
    """Whether line ``number`` (0-based) of ``raw`` (the separators made spaces) holds a
    ``'\\r'`` between two fields' characters: the end of a line an editor shows.  Not one
    beside a separator (a space in ``raw``: ``'1::10\\r::4'`` is a stray ``'\\r'`` in a
    short line), nor a CRLF line's (stripped)."""
    begin = 0 if number == 0 else int(newlines[number - 1]) + 1
    end = int(newlines[number]) if number < len(newlines) else len(raw)
    return _JOINED_BYTES.search(raw, begin, end) is not None


def _quote(line: str) -> str:
    """``line`` quoted for a refusal, cut to its first ``_QUOTED`` characters (the format
    hint reads the whole line: a line of the very format being read could show, cut, the
    field count that format takes)."""
    return (f"{line!r}" if len(line) <= _QUOTED else
            f"{line[:_QUOTED]!r} (its first {_QUOTED} of {len(line)} characters)")


def _other_format(line: str, read_as: Optional[str] = None) -> str:
    """A hint when ``line`` is a rating line of another format than ``read_as`` (a csv file
    read as ml-100k: its field count once split at that format's separator, each field one
    token; a comment with commas is none): ``format`` is the mistake."""
    for fmt, (sep, (lo, hi), _, _) in _FORMATS.items():
        if sep is None or fmt == read_as:  # (a 3-field line of a 4-column csv file: no hint)
            continue
        fields = line.split(sep.decode())
        if lo <= len(fields) <= hi and all(len(f.split()) == 1 for f in fields):
            return (f"; its fields are separated by {sep.decode()!r}, as in format {fmt!r}: "
                    f"check format= (one of {list(_FORMATS)})")
    return ""


def _underscored(buf: np.ndarray, starts: np.ndarray) -> Optional[np.ndarray]:
    """Which tokens (starting at ``starts``) hold a ``_``; None when no byte is one.

    Python and numpy read ``1_000`` as 1000 (PEP 515); a rating file means
    something else by it, so numbers with ``_`` are refused (found here in
    one pass over the bytes, not token by token).
    """
    at = np.flatnonzero(buf == ord("_"))
    if len(at) == 0:
        return None
    out = np.zeros(len(starts), dtype=bool)
    out[np.searchsorted(starts, at, side="right") - 1] = True
    return out


#: The characters of a line that a field-count error quotes
_QUOTED = 200


def _line(raw: bytes, newlines: np.ndarray, number: int) -> str:
    """Line ``number`` (0-based) of ``raw``, whole, stripped (the caller cuts it to quote)."""
    begin = 0 if number == 0 else int(newlines[number - 1]) + 1
    end = int(newlines[number]) if number < len(newlines) else len(raw)
    return _text(raw[begin:end]).strip()


def _line_at(raw: bytes, at: int) -> Tuple[int, bytes]:
    """``(number, line)``: the 1-based number of the line of ``raw`` holding its byte
    ``at``, and that line's bytes (no newline; what a refusal quotes of it)."""
    end = raw.find(b"\n", at)
    return (raw.count(b"\n", 0, at) + 1,
            raw[raw.rfind(b"\n", 0, at) + 1:len(raw) if end < 0 else end])


def _column(tokens: _Tokens, index: np.ndarray, dtype: Any, path: str,
            line: np.ndarray, what: str, underscored: Optional[np.ndarray]) -> np.ndarray:
    """Convert ``tokens[index]`` to ``dtype``, naming the first bad line on failure."""
    kind = "an integer" if dtype is np.int64 else "a finite number"
    _refuse_underscores(tokens, index, underscored, path, line, f"{what} must be {kind}")
    picked = tokens.pick(index)
    try:
        out = picked.astype(dtype)
    except (ValueError, OverflowError):
        out = None
    if out is not None and (dtype is np.int64 or np.isfinite(out).all()):
        return out
    convert = int if dtype is np.int64 else float
    for k, token in enumerate(picked.tolist()):  # slow path: find the culprit
        try:
            value = convert(token)
        except (ValueError, OverflowError):
            value = None
        # (an int id beyond int64 is kept exact by _big_ints: never the culprit here)
        if value is None or (convert is float and not np.isfinite(value)):
            raise ValueError(f"{path}, line {line[k]}: {what} must be {kind}, "
                             f"got {_text(token)!r}")
    raise AssertionError("unreachable: conversion failed without a bad token")


def _refuse_underscores(tokens: _Tokens, index: np.ndarray,
                        underscored: Optional[np.ndarray], path: str, line: np.ndarray,
                        rule: str) -> None:
    """``ValueError`` naming the first of ``tokens[index]`` that holds a ``_``."""
    if underscored is None:
        return
    bad = np.flatnonzero(underscored[index])
    if len(bad):
        k = int(bad[0])
        raise ValueError(f"{path}, line {line[k]}: {rule}, got "
                         f"{_text(tokens[index[k]])!r} (no '_' in numbers)")


def _remap(ids: np.ndarray, mapping: Optional[Dict[Any, int]],
           what: str) -> Tuple[Dict[Any, int], np.ndarray]:
    """``(new, index)``: the ids missing from ``mapping`` and the index of every id.

    ``new`` maps the ids ``mapping`` lacks to ``len(mapping), ...`` in sorted
    order; ``mapping`` itself is not changed (the caller commits ``new`` once
    nothing can fail any more), ``None`` is an empty map.
    """
    keys, inverse = _unique(ids)
    mapping = {} if mapping is None else mapping
    new: Dict[Any, int] = {}
    position = np.empty(len(keys), dtype=np.int64)
    for k, key in enumerate(keys):
        index = mapping.get(key)
        if index is None:
            index = new[key] = len(mapping) + len(new)
        position[k] = index
    return new, position[inverse]


def _ids(tokens: _Tokens, index: np.ndarray, path: str, line: np.ndarray,
         what: str, numeric: bool, underscored: Optional[np.ndarray],
         as_str: bool = False) -> np.ndarray:
    """The ``what`` ids: int64, Python ints beyond int64, or (``csv`` and ``text``, not
    ``numeric``) the file's strings when not every id is an integer.

    An id with a ``_`` is no integer: refused in the numeric formats, a string
    in ``csv`` and ``text`` (so ``1_0`` and ``10`` stay two users).  ``as_str``: strings
    (checked as integers first in the numeric formats), to look up in a given
    map whose ids are strings.
    """
    if numeric:
        _refuse_underscores(tokens, index, underscored, path, line,
                            f"the {what} id must be an integer")
        if as_str:
            _ids(tokens, index, path, line, what, numeric, underscored)
    array = tokens.pick(index)
    if not as_str and (underscored is None or not underscored[index].any()):
        try:
            return array.astype(np.int64) if len(index) else np.zeros(0, np.int64)
        except (ValueError, OverflowError):
            pass
        big = _big_ints(array.tolist())
        if big is not None:  # 20-digit ids: exact Python ints (numpy cannot sort them mixed)
            return big
    if numeric and not as_str:
        return _column(tokens, index, np.int64, path, line, f"the {what} id", None)
    # csv and text: ids are integers when they all are, else every id is the file's
    # UTF-8 string ("0013" and "13" two ids, "7" the string "7" beside "A7"), each
    # distinct token decoded once
    picked: List[bytes] = array.tolist()
    del array  # (the bytes array freed before the decoded strings are made: a lower peak)
    out = np.empty(len(picked), dtype=object)
    try:
        text = {token: token.decode("utf-8") for token in set(picked)}
    except UnicodeDecodeError:  # slow path: the first bad token in the file's order
        for k, token in enumerate(picked):
            try:
                token.decode("utf-8")
            except UnicodeDecodeError as e:
                # the byte's offset in its line, not in the id (the ids of csv and text
                # are split at one-byte separators: raw's offsets are the file's)
                at = int(tokens.starts[index[k]])
                at += e.start - (tokens.raw.rfind(b"\n", 0, at) + 1)
                raise ValueError(f"{path}, line {line[k]}: the {what} id is not UTF-8 text "
                                 f"({e.reason} at byte {at} of the line): {token!r}; the "
                                 f"file must be UTF-8 encoded: {_REENCODE}") from None
        raise AssertionError("unreachable: decoding failed without a bad token") from None
    out[:] = [text[token] for token in picked]
    return out


def _str_keyed(mapping: Optional[Dict[Any, int]]) -> bool:
    """Whether a given map holds string ids (a ``text`` file with non-integer ids)."""
    return bool(mapping) and any(isinstance(key, str) for key in mapping)  # type: ignore[union-attr]


def _int_ids_for(ids: np.ndarray, mapping: Optional[Dict[Any, int]]) -> np.ndarray:
    """String ``ids`` with the integer-looking ones as ints when the given map's ids are
    integers: the file that made the map read them so (``"1"`` there is user ``1``)."""
    if ids.dtype != object or not mapping or _str_keyed(mapping):
        return ids
    out: np.ndarray = ids.copy()
    for k, key in enumerate(ids.tolist()):
        if isinstance(key, str) and _INT_TOKEN.fullmatch(key):
            out[k] = int(key)
    return out


#: An id token that reads as an integer (no ``_``: ``1_0`` stays a string).
_INT_TOKEN = re.compile(r"[+-]?[0-9]+")


def _unique(ids: np.ndarray) -> Tuple[List[Any], np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` (as a list and int64 inverse), also for
    ids mixing ints and strings (a map's ints beside a file's string ids): ints first.

    Object ids (strings, Python ints beyond int64) are hashed, and only the distinct
    ones sorted: numpy sorts every object (1.3 s for 1M string ids on one CPU thread,
    0.1 s so for a few thousand distinct ones).
    """
    if ids.dtype == object:
        try:
            return _unique_objects(ids.tolist())
        except TypeError:  # unhashable ids: numpy's sort, which may order them
            pass
    try:
        unique, inverse = np.unique(ids, return_inverse=True)
        return unique.tolist(), inverse.reshape(-1)
    except TypeError:
        return _unique_objects(ids.tolist())


def _unique_objects(values: List[Any]) -> Tuple[List[Any], np.ndarray]:
    """:func:`_unique` of hashable ids: the distinct ones sorted, ints before strings."""
    keys = sorted(set(values), key=lambda key: (isinstance(key, str), key))
    where = {key: k for k, key in enumerate(keys)}
    return keys, np.fromiter((where[key] for key in values), np.int64, len(values))


def _big_ints(tokens: List[bytes]) -> Optional[np.ndarray]:
    """Tokens that are all integers as an object array of Python ints, else None."""
    out = np.empty(len(tokens), dtype=object)
    for k, token in enumerate(tokens):
        try:
            out[k] = int(token)
        except ValueError:
            return None
    return out


def _id_array(ids: Any, name: str = "ids") -> np.ndarray:
    """``ids`` as a 1-D numpy array; Python ints beyond int64 kept exact (object dtype)."""
    if ids is None or isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise TypeError(f"{name} must be a sequence of ids (a list, array or tensor), "
                        f"got {type(ids).__name__}")
    if isinstance(ids, Tensor):
        refuse_meta(ids, name)
        if ids.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor or a sequence of ids, got layout "
                            f"{ids.layout}")
        ids = _host(ids).numpy()
    try:
        out = np.asarray(ids)
    except OverflowError:
        out = np.empty(len(ids), dtype=object)
        out[:] = list(ids)
    except ValueError:  # ragged: numpy's "inhomogeneous shape"
        raise ValueError(f"{name} must be 1-D, one id per rating, got nested sequences of "
                         f"different lengths") from None
    if out.ndim != 1:
        if isinstance(ids, (dict, set, frozenset)):  # numpy makes a 0-d object array of it
            raise TypeError(f"{name} must be a sequence of ids (a list, array or tensor), "
                            f"got {type(ids).__name__}")
        raise ValueError(f"{name} must be 1-D, one id per rating, got shape {out.shape}")
    _check_missing(out, ids, name)
    if out.dtype.kind in "US" and not isinstance(ids, np.ndarray):
        # numpy made str of every id: 1 and "1" would be one user, 8 would become "8"
        other = next((v for v in ids if not isinstance(v, (str, bytes))), None)
        if other is not None:
            first = next(v for v in ids if isinstance(v, (str, bytes)))
            raise TypeError(f"{name} must hold ids of one kind (all str or all numbers), got "
                            f"{type(first).__name__} {first!r} and {type(other).__name__} "
                            f"{other!r}")
    return out


def _host(t: Tensor) -> Tensor:
    """``t`` on the CPU, detached, with its conjugate and negative bits resolved: what
    ``.numpy()`` reads (it refuses a tensor with either bit set, e.g. ``z.conj().imag``)."""
    return t.detach().cpu().resolve_conj().resolve_neg()


def _refuse_non_numbers(values: Any, name: str) -> None:
    """``TypeError`` for str or bool entries, which ``np.asarray(..., float64)`` would
    read as numbers ("3" as 3.0, True as 1.0), and for complex ones, whose imaginary
    part it would drop (with a warning only)."""
    try:
        probe = np.asarray(values) if not isinstance(values, np.ndarray) else values
    except (TypeError, ValueError):  # ragged: the float64 conversion after says so
        return
    if probe.dtype.kind == "c":
        raise TypeError(f"{name} must be a sequence of real numbers, got complex values "
                        f"(numpy {probe.dtype})")
    if probe.dtype.kind in "USb" or probe.dtype == object:
        flat = probe.reshape(-1) if probe.dtype != object else probe.ravel()
        bad = next((v for v in flat.tolist() if isinstance(v, (str, bytes, bool))), None)
        if bad is not None:
            raise TypeError(f"{name} must be a sequence of real numbers, got "
                            f"{type(bad).__name__} {bad!r}")


def _check_missing(ids: np.ndarray, given: Any, name: str) -> None:
    """``ValueError`` for a None or NaN id: a missing id is nobody's (NaN != NaN
    merges them all into one user, None cannot be ordered with the other ids)."""
    if ids.dtype.kind in "fc":
        missing = np.isnan(ids)
    elif ids.dtype == object or (ids.dtype.kind in "US" and not isinstance(given, np.ndarray)):
        # numpy turns a NaN among strings into the string 'nan': read the given values
        values = ids if ids.dtype == object else list(given)
        missing = np.fromiter((v is None or (isinstance(v, (float, np.floating)) and v != v)
                               for v in values), dtype=bool, count=len(ids))
        ids = np.asarray(values, dtype=object)
    else:
        return
    if missing.any():
        k = int(np.flatnonzero(missing)[0])
        raise ValueError(f"{name} must hold ids, got {_plain(ids[k])!r} (a missing id) at "
                         f"position {k}")


# -- item titles -----------------------------------------------------------------------

def _csv_item_rows(path: Path, name: str = "path",
                   fix: str = "") -> Iterator[Tuple[int, List[str]]]:
    """``(line number, fields)`` of the non-blank records of a ``movies.csv`` (as
    :func:`_side_lines` gives the other item files'; the number of the physical line a
    record starts on, not its count: a quoted title may hold a newline), its first one
    skipped only when it is a header (``movieId,title,genres``), not an item line: a file without a
    header lost its first item (and a header after a blank line, or after a byte order
    mark and a line break, was read as the item ``'movieId'`` of the genre ``'genres'``).
    The file must be text (:func:`_refuse_not_text`) and UTF-8 (:func:`_utf8_text`:
    ``name`` gave it, ``fix`` ends the refusal's advice), and no record may have more
    fields than its first line (``ValueError``: an unquoted comma in a title split it, and
    its genres were read from the title's second half)."""
    raw = path.read_bytes()
    _refuse_not_text(raw, path, name, "item file")
    text = _utf8_text(raw, path, name, "MovieLens movies.csv is", fix)
    header = True  # the first non-blank line may be a header
    width = 0  # its fields (the header's, else the first item's): no record has more
    reader = csv.reader(io.StringIO(text, newline=""))
    number = 1  # the physical line a record starts on (a quoted title may hold newlines:
    for row in reader:  # the record's count was given, line 3 for a record of line 5)
        start, number = number, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # a blank line (or one of spaces), as the other item files skip
        if header:
            header, width = False, len(row)
            if not _INT_TOKEN.fullmatch(row[0].strip()):
                continue  # the header
        if len(row) > width:  # an unquoted comma: 'Foo, The (1995)' read as the title 'Foo'
            raise ValueError(  # (and ' The (1995)' as its genres), as pandas refuses it
                f"{path}, line {start}: expected at most {width} fields, as the file's first "
                f"line, got {len(row)} in {row!r}; a field holding a comma must be quoted "
                f"('2,\"Foo, The (1995)\",Drama'){fix}")
        yield start, row


#: How a refusal of a file that is not UTF-8 says to fix it
_REENCODE = "re-encode it as UTF-8 (from latin-1: iconv -f latin1 -t utf-8)"


def _utf8_text(raw: bytes, path: Path, name: str, why: str, fix: str = "") -> str:
    """``raw`` (the bytes of the file ``path``, given as the argument ``name``) decoded as
    UTF-8, without a leading byte order mark (:func:`_without_bom`).  A ``ValueError``
    names the first byte that is no UTF-8 (its line, quoted as latin-1, and its offset in
    the file; ``why``: who else writes the file in UTF-8), with :data:`_REENCODE` and
    ``fix``: the codec's ``UnicodeDecodeError`` named neither, and a file read in chunks
    gave an offset into its chunk."""
    try:
        return _without_bom(raw.decode("utf-8"), 1)
    except UnicodeDecodeError as e:
        number, line = _line_at(raw, e.start)
        raise ValueError(f"{name}: {path}, line {number}: expected UTF-8 text ({why} UTF-8), "
                         f"got the byte {raw[e.start:e.start + 1]!r} ({e.reason}, byte "
                         f"{e.start} of the file) in {_text(line).strip()[:_QUOTED]!r}; "
                         f"{_REENCODE}{fix}") from None


#: how a title file listing an item twice is fixed
_ONE_TITLE = "an item file gives each item one title: fix the file, or pass titles=False"


def _read_titles(path: Path, fmt: str) -> Dict[Any, str]:
    """original item id -> title, from ``u.item``, ``movies.dat`` or ``movies.csv`` (a zip
    archive given as ``titles`` was read as text, its bytes quoted as an item id: refused
    where the file's bytes are read, :func:`_refuse_not_text`)."""
    titles: Dict[Any, str] = {}
    seen: Dict[Any, int] = {}  # id -> its line: which title an id listed twice gets is no guess
    if fmt == "csv":
        for number, row in _csv_item_rows(path, "titles", ", or pass titles=False"):
            if len(row) < 2:
                raise ValueError(f"{path}, line {number}: expected movieId,title,..., "
                                 f"got {row!r}")
            key = _csv_item_id(row[0], path, number)
            _once(seen, key, path, number, "item", _ONE_TITLE)
            titles[key] = row[1]
        return titles
    sep = "|" if fmt == "ml-100k" else "::"
    for number, line in _side_lines(path, "titles", "item file", ", or pass titles=False"):
        parts = line.split(sep)
        if len(parts) < 2:
            raise ValueError(f"{path}, line {number}: expected 'id{sep}title{sep}...', "
                             f"got {line.strip()[:200]!r}")
        key = _int_id(parts[0], path, number)
        _once(seen, key, path, number, "item", _ONE_TITLE)
        titles[key] = sep.join(parts[1:_title_end(parts, fmt)])
    return titles


def _side_lines(path: Path, name: str, what: str,
                fix: str = "") -> Iterator[Tuple[int, str]]:
    """``(line number, line)`` of the non-blank lines of a MovieLens item or user file (its
    :func:`_side_text`, any line break), the line break stripped and a leading byte order
    mark removed (:func:`_without_bom`) before a line is judged blank: the titles and the
    side features read a file alike (a byte order mark alone on the first line was a
    blank line to the titles, a malformed line to the features).  ``name``: the argument
    that gave the file, ``what`` the file, ``fix`` the end of a refusal's advice
    (:func:`_side_text`'s refusals)."""
    for number, line in enumerate(io.StringIO(_side_text(path, name, what, fix), newline=None),
                                  start=1):
        line = _without_bom(line, number).rstrip("\r\n")
        if line.strip():
            yield number, line


#: a character decoded from a multi-byte UTF-8 sequence, in text decoded with
#: "surrogateescape" (whose invalid bytes are the lone surrogates U+DC80..U+DCFF)
_MULTIBYTE = re.compile("[\u0080-\udc7f\udd00-\U0010ffff]")


def _side_text(path: Path, name: str, what: str, fix: str = "") -> str:
    """The text of a MovieLens item or user file (``u.item``, ``movies.dat``, ``u.user``,
    ``users.dat``), for titles and side features alike: UTF-8 when its bytes are
    (MovieLens-10M's ``movies.dat``; its README: "encoded as UTF-8 ... a departure from
    previous MovieLens data sets"), else latin-1, which decodes any bytes (MovieLens-100K's
    ``u.item`` and -1M's ``movies.dat``, whose ``é`` is the one byte 0xE9: no valid UTF-8).
    A byte order mark is left in, for :func:`_without_bom`; a compressed or binary file and
    a NUL byte anywhere are refused (:func:`_refuse_not_text`; ``name``: the argument that
    gave the file, ``what`` the file), and so is a file of both encodings
    (:func:`_refuse_mixed`)."""
    raw = path.read_bytes()
    _refuse_not_text(raw, path, name, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _refuse_mixed(raw, e, path, name, what, fix)
        return raw.decode("latin-1")


def _refuse_mixed(raw: bytes, error: UnicodeDecodeError, path: Path, name: str, what: str,
                  fix: str) -> None:
    """``ValueError`` for an item or user file ``raw`` that is no valid UTF-8 (``error``:
    the first byte that is none) but holds a valid multi-byte UTF-8 sequence too (a leading
    byte order mark aside): UTF-8 text with a stray latin-1 byte, or latin-1 text with a
    line pasted as UTF-8.  Read as latin-1 (the rule for a file that is not UTF-8), every
    UTF-8 character of it was garbled silently (``'Amélie'`` read as ``'AmÃ©lie'``).  A
    latin-1 file never holds such a sequence in practice (MovieLens-100K's ``u.item`` and
    -1M's ``movies.dat``: each of their accented letters is one byte before an ASCII one):
    in latin-1 it is a capital accented letter (or ``ß``, ``×``) right before a no-break
    space or a symbol (``'É©'``), or a small one before two; such a file is refused too.
    The message names both lines and the byte."""
    start = len(_BOM) if raw.startswith(_BOM) else 0
    text = raw[start:].decode("utf-8", "surrogateescape")
    found = _MULTIBYTE.search(text)
    if found is None:
        return
    at = start + len(text[:found.start()].encode("utf-8", "surrogateescape"))
    utf8_number, utf8_line = _line_at(raw, at)
    number, line = _line_at(raw, error.start)
    raise ValueError(
        f"{name}: {path}, line {number}: expected UTF-8 or latin-1 text throughout the "
        f"{what}, got the byte {raw[error.start:error.start + 1]!r} (no UTF-8: {error.reason}; "
        f"byte {error.start} of the file) in {_mixed(line)!r} and UTF-8 text on line "
        f"{utf8_number} ({_mixed(utf8_line)!r}); read as latin-1, every UTF-8 character "
        f"would be garbled: re-encode the latin-1 lines as UTF-8{fix}")


def _mixed(line: bytes) -> str:
    """A line of a file of both encodings as a reader sees it, for a refusal's quote: its
    valid UTF-8 as UTF-8, every other byte as latin-1, cut to ``_QUOTED`` characters."""
    text = line.decode("utf-8", "surrogateescape")
    return _ESCAPED.sub(lambda m: chr(ord(m.group()) - 0xDC00), text).strip()[:_QUOTED]


#: a byte that is no UTF-8, as "surrogateescape" decodes it
_ESCAPED = re.compile("[\udc80-\udcff]")


def _text(raw: bytes) -> str:
    """``raw`` decoded as UTF-8 when it is valid UTF-8, else as latin-1 (which decodes any
    bytes): what a refusal quotes of a file (a rating file's string ids are UTF-8: a quote
    read as latin-1 alone showed ``'2Ã©0'`` for ``'2é0'``).  An item or user file's text is
    :func:`_side_text`'s, which refuses one of both encodings."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


# u.item (ml-100k): id|title|release date|video release date|url|19 genre flags
_ML100K_ITEM_FIELDS = 24


def _title_end(parts: List[str], fmt: str) -> int:
    """The index after the last field of the title in a split item line: a title holding
    the separator ("A::B" in movies.dat) spans several fields, which the fields after it
    (ml-1m's genres, ml-100k's dates, url and 19 flags) tell apart."""
    if fmt == "ml-1m":
        return max(2, len(parts) - 1)
    return max(2, len(parts) - (_ML100K_ITEM_FIELDS - 2))


def _without_bom(line: str, number: int) -> str:
    """Line ``number`` of a file read as latin-1 or UTF-8, without a leading UTF-8 byte
    order mark."""
    for bom in (_BOM.decode("latin-1"), _BOM.decode("utf-8")):
        if number == 1 and line.startswith(bom):
            return line[len(bom):]
    return line


def _strict_int(text: str) -> int:
    """``int(text)``, but ``ValueError`` for a ``_`` (``int`` reads ``1_0`` as 10)."""
    if "_" in text:
        raise ValueError(f"invalid literal for an integer: {text!r}")
    return int(text)


def _int_id(text: str, path: Path, number: int) -> int:
    try:
        return _strict_int(text)
    except ValueError:
        raise ValueError(f"{path}, line {number}: the item id must be an integer, "
                         f"got {text!r}") from None


def _csv_item_id(text: str, path: Path, number: int) -> Any:
    """The item id of a ``movies.csv`` line: an int when it is one (as the ratings' integer
    ids), else the id as written, for a csv ratings file's string ids (``B001``)."""
    text = text.strip()
    if not text:
        raise ValueError(f"{path}, line {number}: the item id must not be empty")
    return _maybe_int(text)


def _titles(item_map: Dict[Any, int], titles: Dict[Any, str]) -> List[str]:
    out = [""] * len(item_map)
    for original, index in item_map.items():
        out[index] = titles.get(_key_in(titles, original), f"item {original}")
    return out


def _title_file(path: Path, fmt: str, titles: Union[bool, _PathLike]) -> Optional[Path]:
    if titles is False:
        return None
    if titles is True:
        name = _FORMATS[fmt][3]
        found = path.parent / name if name else None
        return found if found is not None and found.is_file() else None
    given = _path(titles)
    if not given.is_file():
        raise ValueError(f"titles: no item file at {given}")
    return given


# -- the rating file and its format (format="auto", a directory as path) -----------------

#: the rating file of each MovieLens download, looked for in a directory given as ``path``
_DIR_FILES: Dict[str, str] = {"ratings.dat": "ml-1m", "ratings.csv": "csv", "u.data": "ml-100k"}
#: the other files of the MovieLens downloads (name -> what it is, the download's rating
#: file), refused as ``path`` beside that rating file (csv would read genome-scores.csv's
#: movieId,tagId,relevance as ratings); elsewhere, or beside another download's rating
#: file (a movies.csv of one's own in ml-1m/), such a name may be a rating file
_OTHER_FILES: Dict[str, Tuple[str, str]] = {
    "u.item": ("item file", "u.data"), "u.user": ("user file", "u.data"),
    "u.genre": ("genre list", "u.data"), "u.occupation": ("occupation list", "u.data"),
    "u.info": ("count file", "u.data"),
    "movies.dat": ("item file", "ratings.dat"), "users.dat": ("user file", "ratings.dat"),
    "tags.dat": ("tag file", "ratings.dat"),
    "movies.csv": ("item file", "ratings.csv"), "tags.csv": ("tag file", "ratings.csv"),
    "links.csv": ("links file (IMDb and TMDb ids)", "ratings.csv"),
    "genome-scores.csv": ("tag genome file", "ratings.csv"),
    "genome-tags.csv": ("tag genome file", "ratings.csv")}
#: MovieLens-100K's rating files: u.data, u1.base ... u5.test, ua/ub.base and .test
_ML100K_NAME = re.compile(r"u\.data|u(\d+|[ab])\.(base|test)")


def _resolve(path: Path, format: str) -> Tuple[Path, str]:
    """The rating file (``path``, or the MovieLens rating file in the directory ``path``)
    and its format (``format``, or the detected one for ``"auto"``)."""
    if path.is_dir():
        path = _rating_file_in(path, format)
    if not path.exists():
        raise ValueError(f"path: no rating file at {path} (it does not exist)")
    if not path.is_file():
        raise ValueError(f"path: {path} is not a regular file")
    if path.name in _OTHER_FILES:  # (genome-scores.csv was read as 3-column ratings)
        what, ratings = _OTHER_FILES[path.name]
        if (path.parent / ratings).is_file():
            raise ValueError(f"path: {path} is no rating file: it is MovieLens's {what}, "
                             f"beside the download's ratings, {ratings}; give "
                             f"{path.parent / ratings} or the directory {path.parent}")
    return path, (_detect(path) if format == "auto" else format)


def _rating_file_in(directory: Path, format: str) -> Path:
    """The one MovieLens rating file in ``directory``; its format must be ``format``
    unless that is ``"auto"``."""
    found = [name for name in _DIR_FILES if (directory / name).is_file()]
    if len(found) != 1:
        what = (f"{len(found)}: {', '.join(found)}" if found
                else f"none (it holds {_listing(directory)})")
        raise ValueError(f"path: {directory} is a directory; give the rating file in it: looked "
                         f"for one of {', '.join(_DIR_FILES)}, found {what}")
    name = found[0]
    if format not in ("auto", _DIR_FILES[name]):
        raise ValueError(f"path: {directory} holds {name}, a file of format "
                         f"{_DIR_FILES[name]!r}, but format is {format!r}; give format "
                         f"{_DIR_FILES[name]!r} or 'auto', or the rating file itself")
    return directory / name


def _listing(directory: Path, most: int = 8) -> str:
    """The first ``most`` names in ``directory`` (folders end with ``/``), for messages."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    if not names:
        return "nothing"
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


def _detect(path: Path) -> str:
    """The format of the rating file ``path``, from its first non-blank line (the rule is
    :func:`read_ratings`'s ``"auto"``)."""
    line = _first_line(path)
    if not line:
        raise ValueError(f"{path} holds no ratings (empty file)")
    if _separated(line, b"::"):
        return "ml-1m"
    commas = _separated(line, b",")
    if commas in (3, 4):
        return "csv"
    if commas:
        raise ValueError(
            f"path: cannot detect the format of {path}: its first line "
            f"{_text(line)[:200]!r} has {commas} comma-separated fields, and "
            f"format 'csv' reads 3 or 4, user,item,rating[,timestamp] (MovieLens "
            f"ratings.csv: userId,movieId,rating,timestamp); "
            f"no format reads {commas} comma-separated fields: save the file "
            f"whitespace-separated, 'user item rating [timestamp]', and give format 'text'")
    if _separated(line, b"\t") == 4 and (_ML100K_NAME.fullmatch(path.name) is not None
                                        or _int_ids(line.split(b"\t"))):
        return "ml-100k"
    return "text"


def _first_line(path: Path) -> bytes:
    """The first non-blank line of the file ``path`` (after a UTF-8 byte order mark),
    stripped; ``b""`` for a file of blank lines.  The file is read up to the end of that
    line only, however far it lies (blank lines first, or a line longer than a buffer)."""
    with open(path, "rb") as f:
        _refuse_binary(_head(f), path)
        f.seek(0)
        for number, line in enumerate(f):
            if number == 0 and line.startswith(_BOM):
                line = line[len(_BOM):]
            if line.strip():
                return line.strip()
    return b""


def _separated(line: bytes, sep: bytes) -> int:
    """How many fields ``sep`` splits ``line`` into when it separates them (at least two,
    none holding whitespace between characters: ``"a::b c 4"`` is a ``text`` line), else 0."""
    fields = line.split(sep)
    return len(fields) if len(fields) > 1 and all(len(f.split()) <= 1 for f in fields) else 0


def _int_ids(fields: List[bytes]) -> bool:
    """Whether the user and item fields are integers (MovieLens ids; ``text`` ids may be
    any token, ``1_0`` included)."""
    return all(_INT_TOKEN.fullmatch(f.strip().decode("latin-1")) for f in fields[:2])


@contextmanager
def _detected(auto: bool, fmt: str, path: Path) -> Iterator[None]:
    """A ``ValueError`` of parsing the lines names the format ``"auto"`` chose (``fmt``):
    the file may be another.  (Not the errors of well-parsed ratings, repeated pairs, an
    overflow, the title file: another format would not cure them.)"""
    try:
        yield
    except ValueError as error:
        if not auto:
            raise
        raise ValueError(f"{error} (format 'auto' read {path.name} as {fmt!r}, from its first "
                         f"line; give format= to read another)") from None


def detect_format(path: _PathLike) -> str:
    r"""The format :func:`read_ratings` reads ``path`` in with ``format="auto"``.

    Args:
        path (str or PathLike): a rating file, or a directory holding exactly one
            MovieLens rating file (``ratings.dat``, ``ratings.csv`` or ``u.data``).

    Returns:
        str: one of :data:`FORMATS`, detected from the first non-blank line of the
        file (the rule is :func:`read_ratings`'s); the file is read up to the end of
        that line only.

    Raises:
        ValueError: a missing file, a directory with none or several rating files, a
            compressed or binary file (a NUL byte in the first 4096 bytes: the message
            gives its line), an empty file (or one of blank lines), a first line of
            comma-separated fields that are not 3 or 4.
        TypeError: ``path`` not a str or ``os.PathLike``.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = (pathlib.Path(d) / "ratings.dat").write_text("1::1193::5::978300760\n")
        ...     detect_format(pathlib.Path(d) / "ratings.dat"), detect_format(d)
        ('ml-1m', 'ml-1m')
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return _resolve(_path(path), "auto")[1]


# -- public readers ----------------------------------------------------------------------

def read_ratings(path: _PathLike, format: str = "auto", *, titles: Union[bool, _PathLike] = True,
                 user_map: Optional[Dict[Any, int]] = None,
                 item_map: Optional[Dict[Any, int]] = None,
                 unseen: str = "keep") -> Ratings:
    r"""Read a rating file into a :class:`Ratings` record.

    Args:
        path (str or PathLike): the rating file, or a directory holding exactly
            one MovieLens rating file (``ratings.dat``, ``ratings.csv`` or
            ``u.data``: an unzipped download such as ``ml-1m/``).  A leading ``~``
            is the home directory, in every reader's paths (as in pandas).
        format (str): one of

            * ``"auto"`` (default): detected from the file's first non-blank line
              (after a byte order mark; the file is read up to that line), see below;
            * ``"ml-100k"``: MovieLens-100K ``u.data``, ``uN.base``, ``uN.test``:
              ``user<TAB>item<TAB>rating<TAB>timestamp``; titles from ``u.item``;
            * ``"ml-1m"``: MovieLens-1M/10M ``ratings.dat``:
              ``user::item::rating::timestamp``; titles from ``movies.dat``
              (latin-1 in ML-1M, UTF-8 in ML-10M: an item file is read as UTF-8
              when it is valid UTF-8, else as latin-1; a file of both, UTF-8
              text and a byte that is no UTF-8, is refused);
            * ``"csv"``: comma-separated ``user,item,rating`` and optionally a
              fourth column (ignored), by position, as many on every line as on the
              first, unquoted (a quoted field is refused, a quoted header skipped);
              a first line with no number in it is a header, skipped
              (MovieLens ``ratings.csv``: ``userId,movieId,rating,timestamp``, half
              stars; goodbooks-10k: ``user_id,book_id,rating``; Amazon's ratings-only
              files: no header, string ids); titles from ``movies.csv``;
            * ``"text"``: whitespace separated ``user item rating``,
              optionally a fourth column (ignored); ids may be any token.
        titles (bool or PathLike): ``True`` (default) reads the format's item
            file when it lies next to ``path``; a path reads that file;
            ``False`` reads none.
        user_map, item_map (dict, optional): maps from original id to index to
            reuse, e.g. the training part's maps when reading its test part.
            They are extended in place by ids they lack (see ``unseen``),
            once the whole file has been read without error.
        unseen (str): what to do with ids missing from given maps:
            ``"keep"`` (default) appends them to the maps (rows or columns with
            no training data; :class:`~nnsparse.data.RatingNormalizer` predicts
            those from the global mean), ``"drop"`` drops their ratings with a
            warning giving the count.

    Returns:
        Ratings: ids remapped to ``0..n-1`` in sorted order of the original
        ids (new ids of given maps come after the old ones), ratings as
        float32, ``titles`` when an item file was read.

    Raises:
        ValueError: unknown ``format`` or ``unseen``, a missing file, a
            directory with none or several MovieLens rating files or with one of
            another format than ``format``, another file of a MovieLens download
            beside its rating file (``movies.dat``, ``tags.csv``,
            ``genome-scores.csv``, ...; the message names the rating file), a
            first line of comma-separated fields that are not 3 or 4
            (``"auto"``), an empty file, a file whose lines do not match
            ``format`` (the message names the file and its 1-based line
            number; an empty field between two separators, ``1,,2,5``, and a
            quoted ``"csv"`` field too), a file whose lines end in a lone
            ``\r`` (classic Mac OS; the message says so, however many lines it
            has) or that holds one on any line (the message gives the first), a
            rating that is not a finite number or overflows float32, a number
            written with ``_`` (``1_000``), a (user, item) pair rated more than
            once (the message gives its lines), ids or a ``"csv"`` item file
            (``movies.csv``) that are not UTF-8 (the message gives the line and
            byte and how to re-encode the file; ``u.item`` and ``movies.dat`` are
            read as latin-1 when they are not UTF-8, as MovieLens-100K's and
            -1M's are, and refused when they hold UTF-8 text too: the message
            gives both lines), an item file listing an item twice (which title
            it has would be a guess), a compressed file (gzip, bzip2, xz:
            decompress it first; an item file given as ``titles`` too), a NUL
            byte anywhere in the file or the item file (the message gives its
            line, and says when it lies in the first 4096 bytes: a binary or
            UTF-16 file), map indices out of range.
            A failed call leaves ``user_map`` and ``item_map`` unchanged.
        TypeError: ``path`` not a str or ``os.PathLike``, ``format`` or
            ``unseen`` not a str, ``titles`` neither a bool nor a path, a map
            that is not a dict of ids to int indices.

    Ids: integers when every user id (every item id) is one (exact beyond int64
    too, as Python ints; ``0013`` is then ``13``, ``+7`` is ``7``); for ``"csv"``
    and ``"text"`` otherwise every user (item) id is the file's UTF-8 string:
    ``A2SUAM1J3GNN3B``, and ``0013`` and ``13`` two ids (an id with ``_`` is a
    string there); the MovieLens formats refuse ids that are no integers.  A
    ``"csv"`` file's first line is skipped only when it is a header (not a rating).  A leading UTF-8 byte order mark is skipped in
    every format.  The check for repeated pairs is one sort of the ratings
    (about half a second for 10M ratings on one CPU thread).

    ``"auto"`` reads the first non-blank line: fields separated by ``::`` are
    ``"ml-1m"``; 3 or 4 comma-separated fields (a header or a rating) are
    ``"csv"``, another count of them a ``ValueError``; 4 tab-separated fields with integer
    user and item ids are ``"ml-100k"`` (also with other ids when the file is
    named like MovieLens-100K's, ``u.data``, ``u1.base``, ``ua.test``: the reader
    then names the bad id); anything else is ``"text"``.  So a whitespace
    separated ``user item rating`` file reads as before, and a tab-separated
    4-field file of integer ids reads as ``"ml-100k"``: the same ids and
    ratings as ``"text"``, with titles from a ``u.item`` beside it.  Only the
    first line is looked at: a file whose first line is such but whose later
    lines ``"ml-100k"`` refuses (3 fields, spaces, a string id), which
    ``"text"`` reads, needs ``format="text"``.  A parsing error under ``"auto"``
    says which format was detected.  :func:`detect_format` gives the detected
    format without reading the ratings.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = pathlib.Path(d) / "u.data"
        ...     _ = p.write_text("196\t242\t3\t881250949\n186\t302\t3.5\t891717742\n")
        ...     r = read_ratings(p, format="ml-100k")
        ...     auto = read_ratings(d)  # the directory: its u.data, format detected
        >>> r.user, r.item, r.rating
        (tensor([1, 0]), tensor([0, 1]), tensor([3.0000, 3.5000]))
        >>> r.user_map, r.item_map
        ({186: 0, 196: 1}, {242: 0, 302: 1})
        >>> auto.user_map == r.user_map and auto.rating.tolist() == r.rating.tolist()
        True
        >>> with tempfile.TemporaryDirectory() as d:  # 3 columns and a header: "csv"
        ...     p = pathlib.Path(d) / "ratings.csv"
        ...     _ = p.write_text("user_id,item_id,rating\nA2SU,0013,5\nA2SU,B13,4\nB7,0013,3\n")
        ...     c = read_ratings(p)
        >>> c.user_map, c.item_map, c.rating
        ({'A2SU': 0, 'B7': 1}, {'0013': 0, 'B13': 1}, tensor([5., 4., 3.]))
    """
    as_choice(format, "format", _CHOICES)
    as_choice(unseen, "unseen", ("keep", "drop"), "'keep' or 'drop'")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    for name, given in (("user_map", user_map), ("item_map", item_map)):
        if given is not None:
            _check_map(given, name)
    if isinstance(titles, np.bool_):  # a numpy bool, as every flag takes it
        titles = as_flag(titles, "titles")
    if not isinstance(titles, (bool, str, os.PathLike)):
        raise TypeError(f"titles must be a bool or a path (str or os.PathLike), "
                        f"got {type(titles).__name__}")
    path, fmt = _resolve(_path(path), format)
    # Every argument is checked before the ratings are read or anything is changed.
    title_file = _title_file(path, fmt, titles)
    return _read(path, fmt, title_file, user_map, item_map, unseen, auto=format == "auto")


def _read(path: Path, format: str, title_file: Optional[Path],
          user_map: Optional[Dict[Any, int]], item_map: Optional[Dict[Any, int]],
          unseen: str, auto: bool = False) -> Ratings:
    """:func:`read_ratings` of the file ``path`` in ``format``, its arguments checked
    (``auto``: ``format`` was detected, which a parsing error names)."""
    sep, fields, header, _ = _FORMATS[format]
    raw = path.read_bytes()
    _refuse_not_text(raw, path)
    if raw.startswith(_BOM):  # before the header check: the BOM is no part of the first line
        raw = raw[len(_BOM):]
    with _detected(auto, format, path):  # the lines, parsed in the format
        why = ""
        if header:  # (csv) a header line or not, and 3 or 4 fields as that first line
            header, width = _csv_head(raw, cast(bytes, sep))
            fields = (width, width)
            if width == 3:  # (a 4-field file's messages are MovieLens ratings.csv's)
                why = f"; the {'header' if header else 'first'} line has 3 fields"
        if sep is not None:
            if format == "csv":
                _refuse_quotes(raw, header, str(path))
            _check_separator(raw, sep, format, str(path), header, fields)
            # Fields become whitespace-separated tokens; a separator next to
            # whitespace would merge fields, so an empty field shows as a missing one.
            original: Optional[bytes] = raw
            raw = raw.replace(sep, b" ") if len(sep) > 1 else raw.translate(_translation(sep))
        else:
            original = None
        name = str(path)
        tokens, first, line, underscored = _tokenise(raw, name, fields, header, original,
                                                     format, why)
        if sep is not None:
            _check_separator_counts(cast(bytes, original), raw, sep, format, line,
                                    fields[0], name)
        numeric = format in ("ml-100k", "ml-1m")  # csv and text: ids may be strings
        # ids of the kind the given maps hold: a training file with a string id made them
        # strings there, so the test file's "1" must be looked up as "1" (and as 1 if not)
        user = _int_ids_for(_ids(tokens, first, name, line, "user", numeric, underscored,
                                 _str_keyed(user_map)), user_map)
        item = _int_ids_for(_ids(tokens, first + 1, name, line, "item", numeric, underscored,
                                 _str_keyed(item_map)), item_map)
        try:
            rating = _column(tokens, first + 2, np.float64, name, line, "the rating",
                             underscored)
        except ValueError as error:  # a header with a number in it ('user,item,rating,2020')
            if (format == "csv" and not header and len(line)
                    and str(error).startswith(f"{name}, line {line[0]}:")
                    and not _is_number(tokens[int(first[0])])):
                raise ValueError(f"{error}; a first line is a header (skipped) only when "
                                 f"none of its fields is a number") from None
            raise
    rating32 = _float32(rating)
    if not np.isfinite(rating32).all():
        k = int(np.flatnonzero(~np.isfinite(rating32))[0])
        raise ValueError(f"{path}, line {line[k]}: the rating "
                         f"{_text(tokens[first[k] + 2])!r} overflows the rating "
                         f"dtype float32 (at most {_FLOAT32_MAX:.4g} in size)")
    keep = None
    if unseen == "drop" and (user_map is not None or item_map is not None):
        keep = _known(user, user_map) & _known(item, item_map)
        dropped = int((~keep).sum())
        if dropped:
            warnings.warn(f"{path}: dropped {dropped} of {len(keep)} ratings whose user or "
                          f"item is not in the given maps", stacklevel=3)
        user, item, rating32, line = user[keep], item[keep], rating32[keep], line[keep]
        if len(rating32) == 0:
            raise ValueError(f"{path}: no rating left after dropping unseen users and items")
    new_users, user_index = _remap(user, user_map, "user")
    new_items, item_index = _remap(item, item_map, "item")
    _check_file_pairs(user_index, item_index, len(item_map or {}) + len(new_items),
                      (user, item, line), name)
    title_list = None
    if title_file is not None:
        title_list = _titles({**(item_map or {}), **new_items}, _read_titles(title_file, format))
    # Nothing can fail any more: extend the caller's maps (shared by a split).
    user_map = new_users if user_map is None else _commit(user_map, new_users)
    item_map = new_items if item_map is None else _commit(item_map, new_items)
    ratings = Ratings(torch.from_numpy(user_index), torch.from_numpy(item_index),
                      torch.from_numpy(rating32), user_map, item_map,
                      titles=title_list, source=name)
    ratings._mark_unique()  # _check_file_pairs found no pair twice in the file
    return ratings


def _check_file_pairs(user_index: np.ndarray, item_index: np.ndarray, n_items: int,
                      where: Tuple[np.ndarray, np.ndarray, np.ndarray], path: str) -> None:
    """``ValueError`` naming the lines of a (user, item) pair the file rates twice.

    One sort of the pair keys (about 0.5 s for 10M ratings on one CPU thread);
    ``where`` is the original user and item ids and the line of each rating.
    """
    key = torch.from_numpy(user_index * n_items + item_index)
    pairs, repeated = _repeated_keys(torch.sort(key)[0])
    if pairs:
        at = np.flatnonzero(key.numpy() == repeated)
        user, item, line = where
        lines = ", ".join(str(n) for n in line[at[:5]].tolist()) + (", ..." if len(at) > 5 else "")
        raise ValueError(_repeats_message(path, pairs, _plain(user[at[0]]), _plain(item[at[0]]),
                                          f"lines {lines}"))


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value (``1``, not ``np.int64(1)``, in messages)."""
    return value.item() if isinstance(value, np.generic) else value


def _commit(mapping: Dict[Any, int], new: Dict[Any, int]) -> Dict[Any, int]:
    mapping.update(new)
    return mapping


def _csv_head(raw: bytes, sep: bytes) -> Tuple[bool, int]:
    """``(header, width)`` of a csv file: whether its first non-blank line is a header (no
    field a number: ``userId,movieId,rating``), not a rating (``A2SU,0013,4.0``: ids may be
    strings, the rating is a number), and the fields every line must have: 3 when that line
    has 3 (``user,item,rating``), else 4 (``...,timestamp``; a line of another count is
    refused by the tokeniser, as a 4-field format refuses it)."""
    start = 0
    while start < len(raw):
        end = raw.find(b"\n", start)
        end = len(raw) if end < 0 else end
        line, start = raw[start:end], end + 1
        if line.strip():
            fields = line.split(sep)
            width = 3 if len(fields) == 3 else 4
            if len(fields) < 3:
                return False, width  # not this format's header: the checks below say why
            return not any(_is_number(f) for f in fields), width
    return True, 4


def _is_number(field: bytes) -> bool:
    try:
        float(field)
        return True
    except ValueError:
        return False


def _check_separator(raw: bytes, sep: bytes, fmt: str, path: str, header: bool,
                     fields: Tuple[int, int] = (4, 4)) -> None:
    """Refuse a file whose lines are not separated by ``fmt``'s separator.

    A rating line of ``fields[0]`` fields has one separator fewer (3 in the
    MovieLens formats, 2 in a 3-column csv file); whitespace would otherwise
    split fields too and hide a wrong ``format``.
    """
    _refuse_edge_separator(raw, sep, path)
    lo, hi = fields
    # fast path: enough separators for every line (blank lines counted too; a final
    # newline ends the last line and starts none: counting one more line there sent every
    # file that ends as text files do down the line-by-line loop below)
    lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
    if raw.count(sep) >= (lo - 1) * (lines - header):
        return
    for number, line in enumerate(raw.split(b"\n"), start=1):
        # a line whose fields only whitespace separates (a wrong field count, and two
        # lines joined by a lone '\r', are left to the tokeniser's message)
        spaced = line.replace(sep, b" ")
        if (line.strip() and line.count(sep) < lo - 1 and not (header and number == 1)
                and lo <= len(spaced.split()) <= hi and not _JOINED_BYTES.search(spaced)):
            raise _separator_error(path, number, fmt, sep,
                                   _text(line).strip()[:_QUOTED])


def _separator_error(path: str, number: int, fmt: str, sep: bytes, line: str) -> ValueError:
    """The error for line ``number`` (1-based; ``line`` as quoted) whose fields whitespace
    separates, not ``fmt``'s separator ``sep``: ``format`` is likely the mistake."""
    return ValueError(f"{path}, line {number}: format {fmt!r} separates the fields with "
                      f"{sep.decode()!r}, got {line!r}; check format= (one of "
                      f"{list(_FORMATS)})")


def _refuse_edge_separator(raw: bytes, sep: bytes, path: str) -> None:
    """A line that starts or ends with the separator holds an empty field (``1::2::3::4::``):
    the separators become spaces, so it would read as the fields beside it, silently.
    Three searches of the file (about 0.5 s for ML-10M's 250 MB on one CPU thread)."""
    after_break = raw.find(b"\n" + sep)
    found = [p for p in (after_break + 1 if after_break >= 0 else -1,
                         raw.find(sep + b"\n"), raw.find(sep + b"\r\n"),
                         0 if raw.startswith(sep) else -1,
                         len(raw) - len(sep) if raw.endswith(sep) else -1) if p >= 0]
    if found:
        at = min(found)
        number, line = _line_at(raw, at)
        raise ValueError(f"{path}, line {number}: a line starts or ends "
                         f"with the separator {sep.decode()!r} (an empty field), got "
                         f"{_text(line).rstrip(chr(13))[:200]!r}")


def _refuse_quotes(raw: bytes, header: bool, path: str) -> None:
    """``ValueError`` naming the first rating line of a csv file with a quoted field
    (``"A1",B7,5``): the reader splits at every separator and keeps the quotes, so
    ``"A1"`` was read as an id of four characters, silently (and ``"Smith, J"`` as two
    fields).  A quoted header is skipped as any header.  One search when no ``"`` is in
    the file."""
    if b'"' not in raw:
        return
    first = True
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        if first and header:
            first = False
            continue
        first = False
        if any(f.strip().startswith(b'"') for f in line.split(b",")):
            raise ValueError(f"{path}, line {number}: format 'csv' reads fields without "
                             f"quotes, got {_text(line).strip()[:_QUOTED]!r}; "
                             f"save the file without quoting (the quotes would be part of "
                             f"the ids)")


def _check_separator_counts(original: bytes, raw: bytes, sep: bytes, fmt: str,
                            line: np.ndarray, want: int, path: str) -> None:
    """``ValueError`` naming the first rating line (``line``: 1-based, of the records)
    without ``want - 1`` separators in ``original`` (``raw``: the separators made spaces).

    The tokeniser counts whitespace-separated tokens: an empty field beside an extra
    separator (``1,,2,5`` in a 3-column csv file, ``1::2::::5::0``) read as the fields
    around it, silently.  About 0.03 s for MovieLens-1M's 1M lines on one CPU thread."""
    # each line's separators from its length without them: a one-byte separator deleted,
    # '::' made one space in raw (a bincount of the separators' lines took 4 times longer)
    shorter, per = ((original.translate(None, sep), 1) if len(sep) == 1
                    else (raw, len(sep) - 1))
    newlines = np.flatnonzero(np.frombuffer(original, dtype=np.uint8) == 10)
    ends = np.append(newlines, len(original))
    short_ends = np.append(np.flatnonzero(np.frombuffer(shorter, dtype=np.uint8) == 10),
                           len(shorter))
    counts = (np.diff(ends, prepend=-1) - np.diff(short_ends, prepend=-1)) // per
    bad = np.flatnonzero(counts[line - 1] != want - 1)
    if len(bad) == 0:
        return
    number = int(line[bad[0]])
    got = int(counts[number - 1]) + 1
    text = _line(original, newlines, number - 1)[:_QUOTED]
    if got < want:  # whitespace separates some fields: _check_separator's message
        raise _separator_error(path, number, fmt, sep, text)
    raise ValueError(f"{path}, line {number}: expected {want} fields separated by "
                     f"{sep.decode()!r}, got {got} (an empty field): {text!r}")


def _translation(sep: bytes) -> bytes:
    table = bytearray(range(256))
    table[sep[0]] = 32
    return bytes(table)


def _known(ids: np.ndarray, mapping: Optional[Dict[Any, int]]) -> np.ndarray:
    if mapping is None:
        return np.ones(len(ids), dtype=bool)
    unique, inverse = _unique(ids)
    return cast(np.ndarray, np.array([u in mapping for u in unique], dtype=bool)[inverse])


def read_split(train: _PathLike, test: _PathLike, format: str = "auto", *,
               titles: Union[bool, _PathLike] = True,
               unseen: str = "keep") -> Tuple[Ratings, Ratings]:
    r"""Read a given train/test file pair with one shared id map.

    The training file is read first and fixes the indices; the test file is
    remapped with the same maps (:func:`read_ratings` with ``user_map`` and
    ``item_map``), so a user or item has one index in both parts.

    Args:
        train, test (str or PathLike): the two rating files, e.g. MovieLens-100K
            ``u1.base`` and ``u1.test``.
        format (str): as in :func:`read_ratings`; ``"auto"`` (default) detects
            the training file's format, which the test file is read in.
        titles (bool or PathLike): as in :func:`read_ratings`.
        unseen (str): test ids absent from the training file: ``"keep"``
            (default; appended to the shared maps, so published test sets stay
            whole) or ``"drop"`` (dropped, with a warning giving the count).

    A (user, item) pair rated in both files gives a warning (the count and the
    first pair): a test error over it measures a fitted rating.

    Returns:
        ``(train, test)``: two :class:`Ratings` sharing ``user_map``,
        ``item_map`` and ``titles``; after ``"keep"`` both have the same
        ``n_users`` and ``n_items``.

    Raises:
        ValueError: ``train`` or ``test`` missing (the message names which) or a
            directory, ``unseen`` unknown, and every refusal of :func:`read_ratings`
            for either file.
        TypeError: ``titles`` neither a bool nor a path; :func:`read_ratings`'s.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     a, b = pathlib.Path(d) / "u1.base", pathlib.Path(d) / "u1.test"
        ...     _ = a.write_text("1\t10\t4\t0\n2\t20\t5\t0\n")
        ...     _ = b.write_text("2\t10\t3\t0\n3\t20\t1\t0\n")
        ...     train, test = read_split(a, b, format="ml-100k")
        >>> test.user, test.item, train.user_map
        (tensor([1, 2]), tensor([0, 1]), {1: 0, 2: 1, 3: 2})
        >>> train.n_users == test.n_users == 3
        True
    """
    if isinstance(titles, np.bool_):  # a numpy bool, as every flag takes it
        titles = as_flag(titles, "titles")
    if not isinstance(titles, (bool, str, os.PathLike)):
        raise TypeError(f"titles must be a bool or a path (str or os.PathLike), "
                        f"got {type(titles).__name__}")
    for name, given in (("train", train), ("test", test)):  # name the part that is missing
        if isinstance(given, (str, os.PathLike)) and not _path(given).exists():
            raise ValueError(f"{name}: no rating file at {given} (it does not exist)")
        if isinstance(given, (str, os.PathLike)) and _path(given).is_dir():
            raise ValueError(f"{name}: {given} is a directory; give the rating file in it")
    first = read_ratings(train, format, titles=False)
    fmt = _detect(_path(train)) if format == "auto" else format  # (train: a file, just read)
    second = read_ratings(test, fmt, titles=False, user_map=first.user_map,
                          item_map=first.item_map, unseen=unseen)
    _warn_shared_pairs(first, second, test)
    title_file = _title_file(_path(train), fmt, titles)
    if title_file is not None:
        first.titles = second.titles = _titles(first.item_map, _read_titles(title_file, fmt))
    return first, second


def _warn_shared_pairs(train: Ratings, test: Ratings, test_file: _PathLike) -> None:
    """A warning when ``test`` rates (user, item) pairs that ``train`` rates too (they
    share one pair of id maps; each file alone was checked for repeats): a test
    error over them measures fitted ratings.  One sort of the keys."""
    key, width = _sorted_pair_keys(train, test)
    pairs, shared = _repeated_keys(key)
    if pairs:
        user, item = divmod(shared, width)
        warnings.warn(f"{test_file}: {pairs} (user, item) pair{'s' if pairs != 1 else ''} "
                      f"of the test file {'are' if pairs != 1 else 'is'} rated in the training "
                      f"file too (first: user {test.user_ids()[user]!r}, item "
                      f"{test.item_ids()[item]!r}); a test error over them measures fitted "
                      f"ratings", stacklevel=3)


# -- side information (CFN++) -------------------------------------------------------------

#: format -> the user file next to the ratings
_USER_FILES = {"ml-100k": "u.user", "ml-1m": "users.dat"}
#: MovieLens-1M's age codes; MovieLens-100K's exact ages are put in the same buckets
_AGES = (1, 18, 25, 35, 45, 50, 56)


def _refuse_binary(head: bytes, path: Path, name: str = "path",
                   what: str = "rating file") -> None:
    """A compressed or binary file, read as text, failed on its first line with its bytes
    quoted ("expected 4 fields, got 2: '\\x8b\\x08...'"): named here from its first
    ``_HEAD`` bytes (``head``: those, or more of the file, whole, for the quote of a NUL's
    line; ``name``: the argument that gave the file, a ``what``, which a zip's advice
    names)."""
    for magic, kind, fix in _ARCHIVES:
        if head.startswith(magic) and (magic != b"BZh" or head[4:10] == b"1AY&SY"):
            if magic == b"PK\x03\x04":
                fix = (_zip_fix(path, fix) if what == "rating file" else
                       f"extract it and give the {what} in it")
            raise ValueError(f"{name}: {path} is {kind} (it starts with {magic!r}), not a text "
                             f"file; {fix}")
    at = head.find(b"\x00", 0, _HEAD)
    if at >= 0:
        raise _nul_error(head, at, path, name)


def _refuse_not_text(raw: bytes, path: Path, name: str = "path",
                     what: str = "rating file") -> None:
    """The bytes ``raw`` of the file ``path`` (a ``what`` given as the argument ``name``),
    whole, before they are read as text: a compressed or binary file refused
    (:func:`_refuse_binary`, from its first ``_HEAD`` bytes), then a NUL byte anywhere
    (:func:`_refuse_nul`).  Every reader of a whole file calls it where it reads the bytes
    (rating, item and user files, titles): one read of the file."""
    _refuse_binary(raw, path, name, what)
    _refuse_nul(raw, path, name)


def _head(f: Any) -> bytes:
    """The first ``_HEAD`` bytes of the binary file ``f`` (open at its start), which
    :func:`_refuse_binary` checks, and the rest of their last line up to ``4 * _QUOTED``
    bytes more: what its refusal quotes of a NUL's line (it was cut at byte 4096)."""
    head = cast(bytes, f.read(_HEAD))
    if len(head) == _HEAD and not head.endswith(b"\n"):
        head += f.readline(4 * _QUOTED)
    return head


def _refuse_nul(raw: bytes, path: Path, name: str = "path") -> None:
    """A NUL byte past the first ``_HEAD`` bytes (:func:`_refuse_binary` reads those) of the
    file ``path`` (``raw``: its bytes, whole; ``name``: the argument that gave it), named
    with its line: numpy's bytes arrays drop a token's trailing NULs, so ``20\\0`` was read
    as the item id 20 and ``3\\0`` as the rating 3, silently, and an item or user file's
    ``Dra\\0ma`` was a genre of its own (a feature column).  One search of the bytes."""
    at = raw.find(b"\x00")
    if at >= 0:
        raise _nul_error(raw, at, path, name)


def _nul_error(raw: bytes, at: int, path: Path, name: str) -> ValueError:
    """The one refusal of a NUL byte at ``raw[at]``, for :func:`_refuse_binary` and
    :func:`_refuse_nul` alike (two wordings, one per check, differed before: "holds NUL
    bytes" and "a NUL byte"): its line quoted (``raw``: the file's bytes from its start,
    whole for a rating file, :func:`_head` for an item or user file and detection), and,
    in the first ``_HEAD`` bytes, what such a file likely is."""
    number, line = _line_at(raw, at)
    where = (f" (in its first {_HEAD} bytes: a binary file or UTF-16 text, not ASCII, UTF-8 "
             f"or latin-1 text)" if at < _HEAD else "")
    return ValueError(f"{name}: {path}, line {number}: a NUL byte (\\x00), which no text file "
                      f"holds, got {_text(line).strip()[:_QUOTED]!r}{where}; save the file "
                      f"as UTF-8 text")


def _zip_fix(path: Path, fix: str) -> str:
    """What to do with the zip archive ``path``: ``fix``, with the MovieLens rating file
    the archive holds (``ml-100k/u.data``) and the directory unzipping it makes, in place of
    the example when it holds one."""
    try:
        with zipfile.ZipFile(path) as archive:
            found = [PurePosixPath(name) for name in archive.namelist()
                     if PurePosixPath(name).name in _DIR_FILES]
    except Exception:  # a hint only: a damaged archive (BadZipFile, an unsupported version's
        return fix     # NotImplementedError, a name not UTF-8 as flagged): the general advice
    if len(found) != 1:
        return fix
    member = found[0]
    makes = f"; unzip {path.name} makes {member.parent}/" if str(member.parent) != "." else ""
    return (f"extract it and give the rating file in it or its directory (it holds "
            f"{member}{makes})")


# (first bytes, what the file is, what to do) for the archives a rating file comes in
_ARCHIVES = ((b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip)"),
             (b"PK\x03\x04", "a zip archive", "extract it and give the rating file in it "
                                            "(e.g. ml-1m/ratings.dat)"),
             (b"BZh", "bzip2-compressed", "decompress it first (bunzip2)"),
             (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz)"))


def _lines(path: Path, sep: str, what: str) -> List[Tuple[int, List[str]]]:
    """The non-blank lines of an item or user file (``what``), split at ``sep``: the lines
    the titles read (:func:`_side_lines`)."""
    return [(n, line.split(sep)) for n, line in _side_lines(path, "path", what)]


def _feature_file(path: _PathLike, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = _path(path)
    if not path.is_file():
        raise ValueError(f"{what}: no file at {path}")
    return path


def _check_map(mapping: Any, name: str) -> None:
    """``TypeError`` unless ``mapping`` is a dict id -> index; ``ValueError`` for bad indices."""
    if not isinstance(mapping, dict):
        hint = f" (pass ratings.{name})" if isinstance(mapping, Ratings) else ""
        raise TypeError(f"{name} must be a dict of original id -> index, got "
                        f"{type(mapping).__name__}{hint}")
    n = len(mapping)
    seen: Dict[Any, Any] = {}
    for original, index in mapping.items():
        if not is_int(index):  # (not a numpy timedelta64, which np.integer holds)
            raise TypeError(f"{name} must map ids to int indices, got "
                            f"{type(index).__name__} for id {original!r}")
        if not 0 <= index < n:
            raise ValueError(f"{name} indices must be in [0, {n}) (one per id), got "
                             f"{index} for id {original!r}")
        if index in seen:
            raise ValueError(f"{name} indices must be distinct (one per id), got {index} "
                             f"for ids {seen[index]!r} and {original!r}")
        seen[index] = original


def _rows(mapping: Dict[Any, int], table: Dict[Any, List[float]], width: int,
          path: Path, name: str) -> Tensor:
    """One feature row per index of ``mapping``; ids the file lacks get zeros.

    ``ValueError`` for a file without entries, or one that shares no id with
    ``mapping`` (another data set's file, or the other map): all-zero
    features would train silently.
    """
    if not table:
        raise ValueError(f"{path}: holds no entries (an empty file, or a header line only)")
    out = torch.zeros(len(mapping), width)
    found = 0
    for original, index in mapping.items():
        key = _key_in(table, original)
        if key in table:
            out[index] = torch.tensor(table[key])
            found += 1
    if mapping and not found:
        raise ValueError(f"{path}: none of {name}'s {len(mapping)} ids is in the file; is it "
                         f"the file of these ratings (and {name} the right map)?")
    return out


def _key_in(table: Dict[Any, Any], original: Any) -> Any:
    """The key of a map's id ``original`` in an item or user file's ``table``: itself, or
    the int it writes (a csv file's ids are all strings when one is no integer: its "1" is
    movies.csv's 1)."""
    return original if original in table else _maybe_int(original)


def _maybe_int(text: Any) -> Any:
    """A string id as the int it writes (``"1"``: an item file's 1), else as it is; ``"1_0"``
    stays a string (``int`` reads it as 10: another item's line)."""
    try:
        return _strict_int(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _once(seen: Dict[Any, int], key: Any, path: Any, number: int, what: str,
          rule: Optional[str] = None) -> None:
    """``ValueError`` when a feature or title file lists the id ``key`` a second time: which
    of its lines holds the features (or the title) would otherwise be decided silently (the
    last).  ``rule`` ends the message (default: the feature files' rule)."""
    if key in seen:
        rule = rule or f"a feature file gives each {what} one line"
        raise ValueError(f"{path}, line {number}: the {what} id {key!r} is listed again (first "
                         f"on line {seen[key]}); {rule}")
    seen[key] = number


def read_item_features(path: _PathLike, format: str, item_map: Dict[Any, int]) -> Tensor:
    r"""Item genre flags from ``u.item`` (ml-100k), ``movies.dat`` (ml-1m) or ``movies.csv``.

    Args:
        path: the item file.
        format (str): ``"ml-100k"`` (the last 19 ``|``-separated fields are
            the genre flags), ``"ml-1m"`` (``id::title::Genre|Genre``) or
            ``"csv"`` (``movieId,title,Genre|Genre``).
        item_map (dict): original item id -> index, e.g. ``ratings.item_map``.

    Returns:
        float32 ``(len(item_map), n_genres)``, one row per item index; items
        absent from the file get a row of zeros.  For ml-1m and csv the
        genres are the sorted set of names in the file.

    A leading UTF-8 byte order mark is skipped (a first line holding only one is a
    blank line, as it is to the titles :func:`read_ratings` reads), and so are blank
    lines; a ``"csv"`` file's first non-blank line is skipped when it is a header.
    ``u.item`` and ``movies.dat`` are read as UTF-8 when they are, else as latin-1
    (MovieLens-100K's and -1M's are latin-1), but not when they hold UTF-8 text too
    (a stray byte in a UTF-8 file: read as latin-1, every UTF-8 character would be
    garbled); ``movies.csv`` must be UTF-8.

    Raises:
        ValueError: a missing file, an unsupported format, a compressed or
            binary file (a zip, gzip, bzip2 or xz file), a NUL byte anywhere (the
            message gives its line; in the first 4096 bytes, that the file looks
            binary or UTF-16), a ``"csv"`` file that is not UTF-8 (the message
            gives the line and byte and how to re-encode it), a ``u.item`` or
            ``movies.dat`` of UTF-8 text and a byte that is no UTF-8 (the message
            gives both lines), a malformed line, an item id on two lines.
        TypeError: ``path`` not a str or ``os.PathLike``, ``format`` not a
            str, ``item_map`` not a dict.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = pathlib.Path(d) / "movies.dat"
        ...     _ = p.write_text("1::Toy Story (1995)::Animation|Comedy\n2::Heat (1995)::Action\n")
        ...     read_item_features(p, "ml-1m", {2: 0, 1: 1, 7: 2})
        tensor([[1., 0., 0.],
                [0., 1., 1.],
                [0., 0., 0.]])
    """
    path = _feature_file(path, "item features")
    _check_map(item_map, "item_map")
    as_choice(format, "format", ("ml-100k", "ml-1m", "csv"), "'ml-100k', 'ml-1m' or 'csv'",
              " for item features")
    table: Dict[Any, List[float]] = {}
    seen: Dict[Any, int] = {}  # id -> its line: an id listed twice is refused
    if format == "ml-100k":
        for number, parts in _lines(path, "|", "item file"):
            if len(parts) < 6:
                raise ValueError(f"{path}, line {number}: expected 'id|title|...|19 genre "
                                 f"flags', got {len(parts)} fields")
            # after the title (which may hold '|': _title_end finds its end), the release
            # date, the video release date and the url, then the flags
            first = _title_end(parts, "ml-100k") + 3
            try:
                key, flags = int(parts[0]), [float(v) for v in parts[first:]]
            except ValueError:
                raise ValueError(f"{path}, line {number}: the id and the genre flags must be "
                                 f"numbers") from None
            bad = [v for v in flags if not math.isfinite(v)]
            if bad:  # ("nan" and "inf" parse as floats: features a fit then refuses)
                raise ValueError(f"{path}, line {number}: the genre flags must be finite "
                                 f"numbers, got {bad[0]}")
            bad = [v for v in flags if v not in (0.0, 1.0)]
            if bad:  # ("2", "-1" and "0.5" parse too: a flag is 0 or 1)
                raise ValueError(f"{path}, line {number}: the genre flags must be 0 or 1, "
                                 f"got {parts[first + flags.index(bad[0])]!r}")
            _once(seen, key, path, number, "item")
            table[key] = flags
        width = max((len(v) for v in table.values()), default=0)
        if any(len(v) != width for v in table.values()):
            raise ValueError(f"{path}: lines have different numbers of genre flags")
        return _rows(item_map, table, width, path, "item_map")
    named: Dict[Any, List[str]] = {}
    if format == "csv":
        for number, row in _csv_item_rows(path):
            if len(row) < 3:
                raise ValueError(f"{path}, line {number}: expected movieId,title,genres")
            key = _csv_item_id(row[0], path, number)
            _once(seen, key, path, number, "item")
            named[key] = row[2].split("|")
    else:
        for number, parts in _lines(path, "::", "item file"):
            if len(parts) < 3:
                raise ValueError(f"{path}, line {number}: expected 'id::title::genres'")
            key = _int_id(parts[0], path, number)
            _once(seen, key, path, number, "item")
            named[key] = parts[-1].split("|")  # (the last field: a title may hold '::')
    vocab = sorted({g for gs in named.values() for g in gs if g})
    column = {g: j for j, g in enumerate(vocab)}
    for key, gs in named.items():
        vec = [0.0] * len(vocab)
        for g in gs:
            if g:
                vec[column[g]] = 1.0
        table[key] = vec
    return _rows(item_map, table, len(vocab), path, "item_map")


def read_user_features(path: _PathLike, format: str, user_map: Dict[Any, int]) -> Tensor:
    r"""User demographics from ``u.user`` (ml-100k) or ``users.dat`` (ml-1m).

    The features: gender (1 for ``F``), the age bucket one-hot (MovieLens-1M's
    7 buckets: under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+), the
    occupation one-hot (the sorted occupations of the file).

    Args:
        path: the user file.
        format (str): ``"ml-100k"`` (``id|age|gender|occupation|zip``) or
            ``"ml-1m"`` (``id::gender::age::occupation::zip``).
        user_map (dict): original user id -> index.

    Returns:
        float32 ``(len(user_map), 1 + 7 + n_occupations)``; users absent from
        the file get zeros.

    The file is read as UTF-8 when it is, else as latin-1, as the item files
    are (a file of UTF-8 text and a byte that is no UTF-8 is refused); a leading UTF-8
    byte order mark is skipped (a first line holding only one is a blank line), and so
    are blank lines.

    Raises:
        ValueError: a missing file, an unsupported format, a compressed or
            binary file (a zip, gzip, bzip2 or xz file), a NUL byte anywhere (the
            message gives its line; in the first 4096 bytes, that the file looks
            binary or UTF-16), a file of UTF-8 text and a byte that is no UTF-8
            (the message gives both lines), a malformed line, a user id on two lines.
        TypeError: ``path`` not a str or ``os.PathLike``, ``format`` not a
            str, ``user_map`` not a dict.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = pathlib.Path(d) / "u.user"
        ...     _ = p.write_text("1|24|M|technician|85711\n2|53|F|other|94043\n")
        ...     f = read_user_features(p, "ml-100k", {1: 0, 2: 1})
        >>> f.shape, f[1, :8].tolist()
        (torch.Size([2, 10]), [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    """
    path = _feature_file(path, "user features")
    _check_map(user_map, "user_map")
    as_choice(format, "format", tuple(_USER_FILES), "'ml-100k' or 'ml-1m'", " for user features")
    sep, (g_at, a_at, o_at) = ("|", (2, 1, 3)) if format == "ml-100k" else ("::", (1, 2, 3))
    parsed = []
    seen: Dict[Any, int] = {}  # id -> its line: an id listed twice is refused
    for number, parts in _lines(path, sep, "user file"):
        if len(parts) < 4:
            raise ValueError(f"{path}, line {number}: expected at least 4 '{sep}'-separated "
                             f"fields, got {len(parts)}")
        try:
            key, age = _strict_int(parts[0]), _strict_int(parts[a_at])
        except ValueError:
            raise ValueError(f"{path}, line {number}: the id and the age must be integers, got "
                             f"{parts[0]!r} and {parts[a_at]!r}") from None
        if age < 0:
            raise ValueError(f"{path}, line {number}: the age must be non-negative, got {age}")
        gender = parts[g_at].strip().upper()
        if gender not in ("F", "M"):
            raise ValueError(f"{path}, line {number}: the gender must be 'M' or 'F', "
                             f"got {parts[g_at].strip()!r}")
        _once(seen, key, path, number, "user")
        parsed.append((key, gender == "F", age, parts[o_at]))
    occupations = sorted({p[3] for p in parsed})
    column = {o: j for j, o in enumerate(occupations)}
    table: Dict[Any, List[float]] = {}
    for key, female, age, occupation in parsed:
        row = [0.0] * (1 + len(_AGES) + len(occupations))
        row[0] = float(female)
        bucket = max(j for j, low in enumerate(_AGES) if age >= low or j == 0)
        row[1 + bucket] = 1.0
        row[1 + len(_AGES) + column[occupation]] = 1.0
        table[key] = row
    return _rows(user_map, table, 1 + len(_AGES) + len(occupations), path, "user_map")
