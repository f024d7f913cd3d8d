"""Seeded splits of a :class:`~nnsparse.data.Ratings` record.

A split keeps the test part apart from the start: train on ``train``, choose
epochs and settings on ``validation``, and read ``test`` once, at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple, Union, cast

import numpy as np
import torch
from torch import Tensor

from .._forms import check_index_range, is_int, is_real
from .readers import Ratings, _check_ratings, _check_unique_pairs, _check_unique_pairs_apart

__all__ = ["Split", "split_ratings", "random_split", "holdout_split", "HeldOut", "UserSplit",
           "user_split"]


@dataclass
class Split:
    """The three parts of a rating set, all sharing one pair of id maps.

    Attributes:
        train (Ratings): what the model learns from (its input and target).
        validation (Ratings): for early stopping and model choice.
        test (Ratings): read once, at the end, for the reported error.

    A field assigned later is checked as the constructor's (a refused assignment
    leaves the split as it was), and so is a split loaded from a file (pickle,
    ``torch.load``), with the constructor's messages; a field cannot be deleted
    (``AttributeError``).

    Raises:
        TypeError: a part that is not a :class:`Ratings` record.
        ValueError: ``validation`` or ``test`` whose ``user_map`` or ``item_map`` is
            not ``train``'s (``train`` assigned later: not the other parts').

    Example::

        >>> from nnsparse.data import synthetic_ratings, random_split
        >>> split = random_split(synthetic_ratings(0, 60, 50, 1200), test=0.1, validation=0.05)
        >>> len(split.train), len(split.validation), len(split.test)
        (1020, 60, 120)
        >>> split.train.user_map is split.test.user_map
        True
    """

    train: Ratings
    validation: Ratings
    test: Ratings

    def __post_init__(self) -> None:
        for name in _SPLIT_FIELDS:
            _check_ratings(getattr(self, name), name)
        for name in ("validation", "test"):  # (O(1) where the maps are shared, as they are)
            _check_maps(name, getattr(self, name), "train's", self.train)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field assigned after construction: the constructor's checks first (a refused
        assignment leaves the split as it was)."""
        _checked_setattr(self, name, value, self._checked)

    def __delattr__(self, name: str) -> None:
        _refuse_field_delete(self, name)

    def _checked(self, name: str, value: Any) -> Ratings:
        _check_ratings(value, name)
        if name == "train":  # validation and test (sharing one pair of maps) must share its
            _check_maps("train", value, "the other parts'", self.validation)
        else:
            _check_maps(name, value, "train's", self.train)
        return cast(Ratings, value)

    def __setstate__(self, state: Any) -> None:
        """Unpickling (``pickle``, ``copy``, ``torch.load``): the constructor's checks, with
        its messages (parts whose id maps differ, a part that is no :class:`Ratings`)."""
        _checked_state(self, state, _SPLIT_FIELDS)

    def __iter__(self) -> Iterator[Ratings]:
        return iter((self.train, self.validation, self.test))


#: The fields of :class:`Split` and :class:`UserSplit`, in ``__init__``'s order.
_SPLIT_FIELDS = ("train", "validation", "test")


def _checked_setattr(record: Any, name: str, value: Any, checked: Callable[[str, Any], Any],
                     fields: Tuple[str, ...] = _SPLIT_FIELDS) -> None:
    """``record.name = value`` for a checked record's ``__setattr__`` (a dataclass whose
    ``__init__`` assigns ``fields`` in order, then ``__post_init__`` checks them): a field
    assigned after construction is ``checked(name, value)`` first (it raises, or returns
    the value to store), so a refused assignment leaves the record as it was."""
    if name in fields and fields[-1] in record.__dict__:  # (not __init__'s assignments,
        value = checked(name, value)                      # which __post_init__ checks)
    object.__setattr__(record, name, value)


def _checked_state(record: Any, state: Any, required: Tuple[str, ...],
                   defaults: Optional[Dict[str, Any]] = None) -> None:
    """``record.__setstate__(state)`` of a checked record (pickle, ``copy``, ``torch.load``,
    whose default unpickler calls it too): the fields set as pickle sets them (``defaults``
    for those an older file lacks), then the constructor's checks, ``__post_init__``, with
    its messages.  Pickle sets the fields without ``__init__``: a file (edited, or written
    from parts that do not belong together) must not give a record its constructor refuses."""
    what = type(record).__name__
    if not isinstance(state, dict):
        raise TypeError(f"a loaded {what}'s state must be a dict of its fields, got "
                        f"{type(state).__name__}")
    missing = [name for name in required if name not in state]
    if missing:
        raise ValueError(f"a loaded {what}'s state lacks the fields {missing} (it holds "
                         f"{sorted(state)})")
    record.__dict__.update({**(defaults or {}), **state})
    record.__post_init__()


def _refuse_field_delete(record: Any, name: str,
                         fields: Tuple[str, ...] = _SPLIT_FIELDS) -> None:
    """``del record.name`` for a checked record's ``__delattr__``: a field is refused (a
    record keeps its fields; deleting the last one also let every later assignment in
    unchecked, :func:`_checked_setattr` reading it missing as a record still in
    ``__init__``)."""
    if name in fields:
        what = type(record).__name__
        keeps = "a split keeps its three parts" if fields == _SPLIT_FIELDS else \
            f"a {what} keeps its fields {list(fields)}"
        raise AttributeError(f"cannot delete {what}.{name}: {keeps} (assign a new {name} "
                             "instead)")
    object.__delattr__(record, name)


def _check_ratio(ratio: float, name: str) -> None:
    if not is_real(ratio):  # (not a bool, nor a numpy timedelta64)
        raise TypeError(f"{name} must be a number in [0, 1), got {type(ratio).__name__} {ratio!r}")
    if not 0 <= ratio < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {ratio!r}")


def _check_seed(seed: Any) -> int:
    """``seed`` as a Python int, checked as :func:`_torch_seed` checks it (any int; not
    folded: ``random_split`` draws its second part with ``seed + 1``)."""
    _torch_seed(seed)
    return int(seed)


#: The seeds ``torch.Generator.manual_seed`` takes (a negative one counts modulo 2**64).
_TORCH_SEEDS = (-2**63, 2**64)


def _torch_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` (any int, as :func:`~nnsparse.data.synthetic_ratings` takes) as a torch seed.

    A seed in torch's range ``[-2**63, 2**64)`` is returned as it is, so the
    draws are those of ``manual_seed(seed)``; any other int is folded into
    ``[0, 2**63)`` by numpy's ``SeedSequence`` (deterministic, every bit
    counts), where torch would raise "Overflow when unpacking long long".
    (Below 2**63, a distributed sampler's ``seed + epoch`` stays in range.)

    Raises:
        TypeError: ``seed`` is not an int (numpy ints pass; a bool does not).
    """
    if not is_int(seed):  # (not a numpy timedelta64, which numbers.Integral takes)
        raise TypeError(f"{name} must be an int, got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if _TORCH_SEEDS[0] <= seed < _TORCH_SEEDS[1]:
        return cast(int, seed)
    words = np.random.SeedSequence([abs(seed), int(seed < 0)]).generate_state(2, np.uint32)
    return (int(words[0]) | int(words[1]) << 32) & (2**63 - 1)


def _concat(a: Ratings, b: Ratings, unique: bool = False) -> Ratings:
    """``a`` and ``b`` (sharing id maps) as one record; ``unique``: the caller knows that
    no (user, item) pair repeats in both together (checked, or disjoint parts of a record
    known unique), and the record is marked so (not checked again)."""
    both = replace(a, user=torch.cat([a.user, b.user]), item=torch.cat([a.item, b.item]),
                   rating=torch.cat([a.rating, b.rating]))
    if unique:
        both._mark_unique()
    return both


def _draw(ratings: Ratings, ratio: float, seed: int) -> Tuple[Ratings, Ratings]:
    """:func:`split_ratings` on checked arguments (``seed`` any int)."""
    n = len(ratings)
    k = round(ratio * n)
    generator = torch.Generator().manual_seed(_torch_seed(seed))
    # (on the CPU, the generator's device, whatever torch's default device)
    order = torch.randperm(n, generator=generator, device="cpu")
    chosen = torch.zeros(n, dtype=torch.bool, device="cpu")
    chosen[order[:k]] = True
    chosen = chosen.to(ratings.rating.device)
    return ratings.subset(~chosen), ratings.subset(chosen)


def split_ratings(ratings: Ratings, ratio: float = 0.1, seed: int = 0) -> Tuple[Ratings, Ratings]:
    r"""Split the ratings at random into ``(rest, part)``, ``part`` holding ``ratio`` of them.

    Entries (not users or items) are drawn uniformly without replacement with
    a ``torch.Generator`` seeded by ``seed``: the same seed gives the same
    split on every machine.  Both parts keep the order of the input and share
    its id maps, so matrices built from them have one shape.

    Args:
        ratings (Ratings): the entries to split.
        ratio (float): the fraction in ``part``, in ``[0, 1)``; the part's
            size is ``round(ratio * len(ratings))``.  Default: 0.1.
        seed (int): the seed of the draw.  Default: 0.

    Returns:
        ``(rest, part)``: two :class:`Ratings`, disjoint, together the input.

    Raises:
        ValueError: ``ratio`` outside ``[0, 1)``; a (user, item) pair rated
            more than once (its ratings could land in both parts).
        TypeError: ``seed`` is not an int.

    Example::

        >>> r = Ratings.from_triples(range(10), range(10), [3.] * 10)
        >>> train, test = split_ratings(r, 0.2, seed=0)
        >>> len(train), len(test), train.n_users
        (8, 2, 10)
        >>> test.user.tolist() == split_ratings(r, 0.2, seed=0)[1].user.tolist()
        True
    """
    _check_ratings(ratings, "ratings")
    _check_ratio(ratio, "ratio")
    seed = _check_seed(seed)
    _check_unique_pairs("ratings", ratings)
    return _draw(ratings, ratio, seed)


def random_split(ratings: Ratings, test: float = 0.1, validation: float = 0.05,
                 seed: int = 0) -> Split:
    r"""A seeded train/validation/test split of one rating set.

    ``test`` is drawn first from all the ratings, then ``validation`` from
    what is left (its ratio is of all the ratings, not of the rest), with the
    seeds ``seed`` and ``seed + 1``.

    Args:
        ratings (Ratings): the whole rating set.
        test (float): fraction of the ratings held out for the test.  Default: 0.1.
        validation (float): fraction of the ratings carved from the training
            part for validation.  Default: 0.05.
        seed (int): the seed of the draws.  Default: 0.

    Returns:
        Split: ``(train, validation, test)``, disjoint, sharing the id maps.

    Raises:
        ValueError: a ratio outside ``[0, 1)`` or ``test + validation >= 1``;
            a (user, item) pair rated more than once.

    Example::

        >>> r = Ratings.from_triples(range(100), [0] * 100, [1.] * 100)
        >>> train, valid, test = random_split(r, test=0.1, validation=0.05, seed=3)
        >>> len(train), len(valid), len(test)
        (85, 5, 10)
    """
    _check_ratings(ratings, "ratings")
    seed = _check_seed(seed)
    _check_ratio(test, "test")
    _check_ratio(validation, "validation")
    if test + validation >= 1:
        raise ValueError(f"test + validation must be below 1, got {test} + {validation}")
    _check_unique_pairs("ratings", ratings)
    rest, test_part = _draw(ratings, test, seed)
    # The validation ratio is of all the ratings: aim for round(validation * n) entries.
    k = min(round(validation * len(ratings)), max(len(rest) - 1, 0))
    train, valid = _draw(rest, k / len(rest) if len(rest) else 0.0, seed + 1)
    return Split(train, valid, test_part)


def holdout_split(train: Ratings, test: Ratings, validation: float = 0.05,
                  seed: int = 0) -> Split:
    r"""A :class:`Split` from a given train/test pair, validation carved from ``train``.

    Use it with :func:`~nnsparse.data.read_split` for published splits such
    as MovieLens-100K ``u1.base``/``u1.test``: the test part is untouched.

    Args:
        train (Ratings): the given training part.
        test (Ratings): the given test part, sharing ``train``'s maps.
        validation (float): fraction of ``train`` held out for validation.
            Default: 0.05.
        seed (int): the seed of the draw.  Default: 0.

    Returns:
        Split: ``(train minus validation, validation, test)``.

    Raises:
        ValueError: ``validation`` outside ``[0, 1)``, parts with different
            id maps, or a (user, item) pair rated more than once in ``train``
            or in ``train`` and ``test`` together (a test rating trained on).

    Example::

        >>> r = Ratings.from_triples(range(22), [0] * 22, [2.] * 22)
        >>> a, b = r.subset(torch.arange(2, 22)), r.subset(torch.tensor([0, 1]))
        >>> s = holdout_split(a, b, validation=0.25, seed=0)
        >>> len(s.train), len(s.validation), len(s.test)
        (15, 5, 2)
    """
    _check_ratings(train, "train")
    _check_ratings(test, "test")
    seed = _check_seed(seed)
    _check_ratio(validation, "validation")
    if train.user_map is not test.user_map or train.item_map is not test.item_map:
        raise ValueError("train and test must share their id maps; read them with "
                         "read_split() or read_ratings(..., user_map=, item_map=)")
    # a test pair trained on is a repeat too
    _check_unique_pairs_apart("train", train, "train and test together", test)
    rest, valid = _draw(train, validation, seed)
    return Split(rest, valid, test)


class HeldOut(NamedTuple):
    """The ratings of held-out users: ``(fold_in, target)``, sharing one pair of id maps.

    Attributes:
        fold_in (Ratings): what the model is given of each held-out user (its
            input at evaluation; those items are left out of the ranking).
        target (Ratings): the rest of the same users' ratings, to be predicted.

    Their matrices of these users only (no empty row for every other user of the maps):
    ``rating_matrix(fold_in, "user", rows=users)``; their lists scored by
    ``ranking_metrics(top, target, users=users)``.

    Example::

        >>> r = Ratings.from_triples([0, 0, 1], [0, 1, 0], [1., 1., 1.])
        >>> fold_in, target = HeldOut(r.subset([0]), r.subset([1]))
        >>> len(fold_in), len(target)
        (1, 1)
    """

    fold_in: Ratings
    target: Ratings


@dataclass
class UserSplit:
    """A split by users (:func:`user_split`): training users, and held-out users' ratings.

    Attributes:
        train (Ratings): every rating of the training users.
        validation (HeldOut): ``(fold_in, target)`` of the validation users.
        test (HeldOut): ``(fold_in, target)`` of the test users, read once, at the end.

    The five parts are disjoint and together the input; they share its id maps.
    Unpacks as ``train, (valid_in, valid_target), (test_in, test_target) = split``.
    A field assigned later is checked as the constructor's (a refused assignment
    leaves the split as it was; a pair is made a :class:`HeldOut`), and so is a
    split loaded from a file (pickle, ``torch.load``), with the constructor's messages;
    a field cannot be deleted (``AttributeError``).

    Raises:
        TypeError: ``train`` or a held-out part that is not a :class:`Ratings` record,
            ``validation`` or ``test`` that is not a ``(fold_in, target)`` pair.
        ValueError: a part whose ``user_map`` or ``item_map`` is not ``train``'s.

    Example::

        >>> from nnsparse.data import synthetic_ratings, user_split
        >>> split = user_split(synthetic_ratings(0, 60, 50, 1200), test=10, validation=5)
        >>> train, (valid_in, valid_target), (test_in, test_target) = split
        >>> len(set(test_in.user.tolist())), split.test.target.user_map is train.user_map
        (10, True)
    """

    train: Ratings
    validation: HeldOut
    test: HeldOut

    def __post_init__(self) -> None:
        # every field checked before any is converted (a plain pair made a HeldOut)
        held = {name: _held_out(name, getattr(self, name), self.train)
                for name in ("validation", "test")}
        for name, part in held.items():
            object.__setattr__(self, name, part)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field assigned after construction: the constructor's checks first (a refused
        assignment leaves the split as it was), a ``(fold_in, target)`` pair made a
        :class:`HeldOut`."""
        _checked_setattr(self, name, value, self._checked)

    def __delattr__(self, name: str) -> None:
        _refuse_field_delete(self, name)

    def _checked(self, name: str, value: Any) -> Any:
        if name == "train":  # the held-out parts (sharing one pair of maps) must share its
            _check_ratings(value, "train")
            _check_maps("train", value, "the held-out parts'", self.validation.fold_in)
            return value
        return _held_out(name, value, self.train)

    def __setstate__(self, state: Any) -> None:
        """Unpickling (``pickle``, ``copy``, ``torch.load``): the constructor's checks, with
        its messages (parts whose id maps differ, a held-out part that is no pair)."""
        _checked_state(self, state, _SPLIT_FIELDS)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.train, self.validation, self.test))


def _held_out(name: str, part: Any, train: Any) -> HeldOut:
    """``UserSplit``'s ``name`` field checked: a ``(fold_in, target)`` pair of Ratings
    sharing ``train``'s id maps (``train`` checked too), as a :class:`HeldOut`."""
    _check_ratings(train, "train")
    if not (isinstance(part, tuple) and len(part) == 2):
        raise TypeError(f"{name} must be a (fold_in, target) pair of Ratings, "
                        f"got {type(part).__name__}")
    for which, ratings in zip(("fold_in", "target"), part):
        _check_ratings(ratings, f"{name} {which}")
        _check_maps(f"{name} {which}", ratings, "train's", train)
    return HeldOut(*part)


def _check_maps(name: str, ratings: Ratings, whose: str, reference: Ratings) -> None:
    """``ValueError`` unless ``ratings`` has ``reference``'s id maps (the parts of one split
    share one pair of map objects: the identity check is O(1))."""
    for key in ("user", "item"):
        mine, theirs = getattr(ratings, key + "_map"), getattr(reference, key + "_map")
        if mine is not theirs and mine != theirs:
            other = "" if len(mine) != len(theirs) else ", with other ids"
            raise ValueError(f"{name} must share {whose} {key}_map (the parts of one split), "
                             f"got one of {len(mine)} {key}s for their {len(theirs)}{other}")


def _user_count(value: Any, name: str) -> None:
    """``value`` a number of users (an int >= 0) or a fraction of them (a float in [0, 1))."""
    if is_int(value):
        if value < 0:
            raise ValueError(f"{name} must be a number of users (an int >= 0) or a fraction "
                             f"of them in [0, 1), got {value!r}")
        return
    if not is_real(value):  # (not a bool, a str, None)
        raise TypeError(f"{name} must be a number of users (an int) or a fraction of them "
                        f"(a float in [0, 1)), got {type(value).__name__} {value!r}")
    if not 0 <= value < 1:
        whole = value > 0 and np.isfinite(float(value)) and float(value) == int(value)
        hint = (f" (for {int(value)} user{'s' if int(value) != 1 else ''} pass the int "
                f"{int(value)})" if whole else "")
        raise ValueError(f"{name} must be a number of users (an int >= 0) or a fraction of "
                         f"them in [0, 1), got {value!r}{hint}")


def user_split(ratings: Ratings, test: Union[int, float] = 0.1,
               validation: Union[int, float] = 0.1, fold_in: float = 0.8,
               seed: int = 0) -> UserSplit:
    r"""A seeded split by users: training users, and validation and test users held out.

    The protocol of the implicit-feedback autoencoders (Mult-DAE, Mult-VAE;
    Liang et al., WWW 2018, "strong generalization"): the model trains on every
    rating of the training users; each validation and test user is held out
    entirely, and its ratings are split at random into a fold-in part (about
    ``fold_in`` of them, the model's input at evaluation) and a target part
    (the rest, to be predicted; rank with the fold-in items excluded).

    Only users with at least two ratings can be held out (one fold-in and one
    target rating at least); a user with fewer always stays in ``train``, and
    the ratios count the users that can be held out.  A held-out user with
    ``n`` ratings gives ``floor((1 - fold_in) * n)`` of them to the target and
    the rest to the fold-in part, as Liang et al.'s code does
    (``int(test_prop * n)`` targets, ``test_prop = 0.2``), with at least one
    rating in each (their code puts a user with fewer than 5 ratings wholly in
    the fold-in part, where it has nothing to predict).  Their code also drops
    the held-out ratings of items that no training user rates (no output of
    the model is trained for them): ``seen = torch.zeros(r.n_items,
    dtype=torch.bool); seen[train.item] = True; part.subset(seen[part.item])``.

    The users are drawn with a ``torch.Generator`` seeded by ``seed``, test
    users first, validation users next from one permutation (so the test users
    do not depend on ``validation``), then one permutation of the entries
    chooses each held-out user's fold-in ratings: the same seed gives the same
    split on every machine.  Every part keeps the order of the input and
    shares its id maps, so matrices built from them have one shape; the matrix of the
    held-out users only is ``rating_matrix(part, "user", rows=users)`` (see
    :class:`HeldOut`).

    Args:
        ratings (Ratings): the whole rating set (clicks: ratings of 1).
        test (int or float): the test users: a number of users (an int) or a
            fraction of the users that can be held out (a float in ``[0, 1)``,
            rounded).  Default: 0.1.
        validation (int or float): the validation users, likewise (two fractions,
            rounded, leave at least one of those users in ``train``).  Default: 0.1.
        fold_in (float): the fraction of each held-out user's ratings in its
            fold-in part, in ``(0, 1)``.  Default: 0.8.
        seed (int): the seed of the draws.  Default: 0.

    Returns:
        UserSplit: ``(train, (validation fold_in, target), (test fold_in, target))``,
        disjoint, together the input, sharing its id maps; no held-out user
        rates anything in ``train``.

    Raises:
        TypeError: ``ratings`` is not a :class:`Ratings` record; ``test`` or
            ``validation`` is not a number; ``fold_in`` is not a number;
            ``seed`` is not an int.
        ValueError: a negative count or a fraction outside ``[0, 1)``;
            ``test + validation >= 1`` as fractions, or above the number of
            users that can be held out as counts (a fraction beside a count
            counted as its rounded share); ``fold_in`` outside ``(0, 1)``;
            ``ratings.user`` edited in place since the record was built, to an
            index outside its ``user_map``;
            a (user, item) pair rated more than once (its ratings could land in
            both the fold-in and the target part).

    Example::

        >>> r = Ratings.from_triples([u for u in range(20) for _ in range(5)],
        ...                          [i for _ in range(20) for i in range(5)], [1.] * 100)
        >>> train, valid, test = user_split(r, test=4, validation=2, fold_in=0.8, seed=0)
        >>> len(train), len(valid.fold_in), len(valid.target), len(test.fold_in), len(test.target)
        (70, 8, 2, 16, 4)
        >>> set(test.fold_in.user.tolist()) == set(test.target.user.tolist())
        True
        >>> set(train.user.tolist()) & set(test.target.user.tolist())
        set()
    """
    _check_ratings(ratings, "ratings")
    _user_count(test, "test")
    _user_count(validation, "validation")
    if not is_real(fold_in):
        raise TypeError(f"fold_in must be a number in (0, 1), got {type(fold_in).__name__} "
                        f"{fold_in!r}")
    if not 0 < fold_in < 1:
        raise ValueError(f"fold_in must be a number in (0, 1), got {fold_in!r}")
    seed = _check_seed(seed)
    if not is_int(test) and not is_int(validation) and test + validation >= 1:
        raise ValueError(f"test + validation must be below 1, got {test} + {validation}")
    user = ratings.user.detach().cpu()
    # (the record's user tensor may have been edited in place since it was checked:
    # bincount and the part table below failed on an index outside the map, naming nothing)
    check_index_range(user, ratings.n_users, "ratings.user indices")
    counts = torch.bincount(user, minlength=ratings.n_users)
    candidates = torch.nonzero(counts >= 2).flatten()  # users in index order
    n = len(candidates)
    k_test = int(test) if is_int(test) else round(test * n)
    if not is_int(test) and not is_int(validation):  # two fractions (sum below 1): rounding
        k_test = min(k_test, max(n - 1, 0))          # up may not take the last candidate
    if is_int(validation):
        k_valid = int(validation)
    elif is_int(test):  # a fraction beside a count: as asked, or refused below
        k_valid = round(validation * n)
    else:  # two fractions, likewise (test's taken first)
        k_valid = min(round(validation * n), max(n - k_test - 1, 0))
    if k_test + k_valid > n:
        fractions = "" if is_int(test) and is_int(validation) else \
            f" (test={test!r}, validation={validation!r})"
        raise ValueError(f"test + validation must be at most the {n} users with at least 2 "
                         f"ratings (the users that can be held out), got {k_test} + {k_valid} "
                         f"users{fractions}")
    _check_unique_pairs("ratings", ratings)
    generator = torch.Generator().manual_seed(_torch_seed(seed))
    # (on the CPU, the generator's device, whatever torch's default device)
    order = candidates[torch.randperm(n, generator=generator, device="cpu")]
    part = torch.zeros(ratings.n_users, dtype=torch.int64, device="cpu")  # 0 train
    part[order[:k_test]] = 2
    part[order[k_test:k_test + k_valid]] = 1
    # each user's entries in a random order (a permutation of all the entries, stably
    # grouped by user), the first count - floor((1 - fold_in) * count) of them its fold-in
    # part (1e-9: 1 - 0.8 is 0.19999999999999996, and 5 of its ratings must give 1 target)
    m = len(ratings)
    shuffled = torch.randperm(m, generator=generator, device="cpu")
    grouped = shuffled[torch.argsort(user[shuffled], stable=True)]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty(m, dtype=torch.int64, device="cpu")
    rank[grouped] = torch.arange(m, device="cpu") - starts[user[grouped]]
    targets = torch.floor((1.0 - fold_in) * counts.double() + 1e-9).long()
    keep = torch.minimum((counts - targets).clamp(min=1), counts - 1)
    first = rank < keep[user]
    device = ratings.rating.device
    entry_part = part[user]

    def pick(mask: Tensor) -> Ratings:
        return ratings.subset(mask.to(device))

    return UserSplit(
        pick(entry_part == 0),
        HeldOut(pick((entry_part == 1) & first), pick((entry_part == 1) & ~first)),
        HeldOut(pick((entry_part == 2) & first), pick((entry_part == 2) & ~first)))
