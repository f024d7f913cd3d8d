"""Tests of nnsparse.data.split: seeded, disjoint, complete splits sharing one id map."""
import re

import numpy as np
import pytest
import torch

from reload import RELOADS, reload
from nnsparse.data import (Ratings, Split, holdout_split, random_split, split_ratings,
                           synthetic_ratings)


@pytest.fixture(scope="module")
def ratings():
    return synthetic_ratings(seed=1, n_users=60, n_items=50, n_ratings=1000)


def keys(r):
    return (r.user * r.n_items + r.item).tolist()


def test_split_ratings_sizes_and_disjoint(ratings):
    rest, part = split_ratings(ratings, 0.1, seed=0)
    assert (len(rest), len(part)) == (900, 100)
    assert not set(keys(rest)) & set(keys(part))
    assert sorted(keys(rest) + keys(part)) == sorted(keys(ratings))
    assert rest.user_map is ratings.user_map and part.item_map is ratings.item_map


def test_split_ratings_deterministic(ratings):
    a = split_ratings(ratings, 0.25, seed=7)[1]
    b = split_ratings(ratings, 0.25, seed=7)[1]
    c = split_ratings(ratings, 0.25, seed=8)[1]
    assert keys(a) == keys(b) and keys(a) != keys(c)
    # The global RNG is not used (nor changed).
    state = torch.random.get_rng_state()
    split_ratings(ratings, 0.25, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())


def test_split_ratings_zero_ratio(ratings):
    rest, part = split_ratings(ratings, 0.0)
    assert len(rest) == len(ratings) and len(part) == 0


@pytest.mark.parametrize("ratio, error", [(-0.1, ValueError), (1.0, ValueError),
                                          (1.5, ValueError), ("0.1", TypeError),
                                          (True, TypeError)])
def test_bad_ratio(ratings, ratio, error):
    with pytest.raises(error, match=r"ratio must be a number in \[0, 1\)"):
        split_ratings(ratings, ratio)


def test_random_split(ratings):
    s = random_split(ratings, test=0.1, validation=0.05, seed=3)
    assert isinstance(s, Split)
    train, valid, test = s
    assert (len(train), len(valid), len(test)) == (850, 50, 100)
    parts = [set(keys(p)) for p in s]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
    assert set().union(*parts) == set(keys(ratings))
    again = random_split(ratings, test=0.1, validation=0.05, seed=3)
    assert all(keys(p) == keys(q) for p, q in zip(s, again))
    # The test part does not depend on the validation ratio: changing how much
    # validation is carved never moves ratings into or out of the test part.
    other = random_split(ratings, test=0.1, validation=0.2, seed=3)
    assert keys(other.test) == keys(test)


def test_random_split_errors(ratings):
    with pytest.raises(ValueError, match="test \\+ validation must be below 1, got 0.6 \\+ 0.4"):
        random_split(ratings, test=0.6, validation=0.4)
    with pytest.raises(ValueError, match="validation must be a number"):
        random_split(ratings, validation=-1)


def test_holdout_split(ratings):
    train, test = split_ratings(ratings, 0.2, seed=0)
    s = holdout_split(train, test, validation=0.1, seed=0)
    assert s.test is test and (len(s.train), len(s.validation)) == (720, 80)
    assert not set(keys(s.train)) & set(keys(s.validation))
    stranger = Ratings.from_triples([0], [0], [1.0])
    with pytest.raises(ValueError, match="train and test must share their id maps"):
        holdout_split(train, stranger)


def _twice():
    # user 2 rates item 20 twice: the copies could land in train and test
    return Ratings.from_triples([1, 2, 2, 3, 4, 5], [10, 20, 20, 30, 10, 20],
                                [1.0, 2.0, 3.0, 4.0, 5.0, 2.0], source="twice.dat")


def _overlap():
    r = Ratings.from_triples([1, 2, 3, 4], [10, 20, 30, 10], [1.0, 2.0, 3.0, 4.0])
    return r, r.subset(torch.tensor([1]))  # the test part is also in train


@pytest.mark.parametrize("call, message", [
    (lambda: split_ratings(_twice(), 0.5), "ratings from twice.dat: 1 (user, item) pair"),
    (lambda: random_split(_twice(), 0.3, 0.2), "ratings from twice.dat: 1 (user, item) pair"),
    (lambda: (lambda r: holdout_split(r, r.subset([0])))(_twice()),
     "train from twice.dat: 1 (user, item) pair"),
    (lambda: holdout_split(*_overlap()), "train and test together: 1 (user, item) pair"),
], ids=["split_ratings", "random_split", "holdout_split-train", "holdout_split-overlap"])
def test_splits_refuse_a_pair_rated_twice(call, message):
    example = "user 2 and item 20 (2 ratings)"
    with pytest.raises(ValueError, match=re.escape(f"{message} rated more than once, e.g. "
                                                   f"{example}; keep one rating per pair")):
        call()


@pytest.mark.parametrize("seed", [2**64, 2**200, -2**63 - 1, np.int64(5)])
def test_any_int_is_a_seed(ratings, seed):
    # synthetic_ratings takes any int (numpy's seeding); so do the splits
    a = split_ratings(ratings, 0.25, seed=seed)[1]
    assert keys(a) == keys(split_ratings(ratings, 0.25, seed=seed)[1])
    assert len(random_split(ratings, seed=seed).test) == 100
    if seed != 5:  # folded, not wrapped: 2**64 is not seed 0
        assert keys(a) != keys(split_ratings(ratings, 0.25, seed=seed % 2**64)[1])


def test_seeds_in_torch_range_draw_as_before(ratings):
    # torch reads a negative seed modulo 2**64: so do the splits, unchanged
    assert keys(split_ratings(ratings, 0.25, seed=-1)[1]) == keys(
        split_ratings(ratings, 0.25, seed=2**64 - 1)[1])
    rest = random_split(ratings, test=0.1, validation=0.05, seed=2**64 - 1)  # seed + 1 folds
    assert len(rest.validation) == 50


@pytest.mark.parametrize("seed, error", [("1", TypeError), (1.0, TypeError), (True, TypeError)])
def test_bad_seed(ratings, seed, error):
    with pytest.raises(error, match=r"seed must be an int, got "):
        split_ratings(ratings, 0.1, seed=seed)


def test_a_split_checks_the_pairs_once(monkeypatch, ratings):
    # the parts of a checked record are known unique: the normaliser and the matrix of a
    # part do not sort the pair keys again (_check_unique_pairs runs once per record)
    from nnsparse.data import RatingNormalizer, rating_matrix, readers
    calls = []
    original = readers._sorted_pair_keys
    monkeypatch.setattr(readers, "_sorted_pair_keys",
                        lambda *parts: (calls.append(len(parts)), original(*parts))[1])
    fresh = ratings.subset(torch.arange(len(ratings)))  # an int subset: not known unique
    train, valid, test = random_split(fresh, 0.1, 0.1, seed=0)
    assert calls == [1]
    assert all(p._known_unique() for p in (fresh, train, valid, test))
    norm = RatingNormalizer(train, "item")
    assert rating_matrix(valid, "user")._nnz() == len(valid)
    assert norm.matrix(test).values().shape == (len(test),)
    holdout_split(train, test, seed=0)  # train and test together: checked, not known
    assert calls == [1, 2]


@pytest.mark.parametrize("default", ["set_default_device", "with-torch.device"])
def test_split_ratings_under_another_default_device(default):
    # the CPU generator's randperm was made on the default device: "Cannot copy out of meta
    # tensor" (the meta device stands for CUDA here), or a generator of the wrong device
    r = synthetic_ratings(0, 20, 15, 100)
    rest, part = split_ratings(r, 0.2, seed=1)
    if default == "set_default_device":
        torch.set_default_device("meta")
        try:
            got = split_ratings(r, 0.2, seed=1)
        finally:
            torch.set_default_device(None)
    else:
        with torch.device("meta"):
            got = split_ratings(r, 0.2, seed=1)
    assert torch.equal(got[0].rating, rest.rating) and torch.equal(got[1].user, part.user)


# -- a Split loaded from a file (pickle, copy, torch.load) is checked as the constructor ---

def _forged_split(**parts):
    """A split of ``synthetic_ratings`` with parts set past the checks (as a file sets them)."""
    split = random_split(synthetic_ratings(seed=1, n_users=20, n_items=15, n_ratings=200),
                         test=0.1, validation=0.1, seed=0)
    for name, value in parts.items():
        object.__setattr__(split, name, value)
    return split


_OTHER = Ratings.from_triples([1, 2], [1, 2], [4., 5.])

# (id, forged split, error, message): the constructor's message for the same parts
FORGED_SPLITS = [
    ("test-other-maps", lambda: _forged_split(test=_OTHER), ValueError,
     "test must share train's user_map (the parts of one split), got one of 2 users for "
     "their 20"),
    ("validation-not-ratings", lambda: _forged_split(validation=[1, 2]), TypeError,
     "validation must be a Ratings record (from read_ratings or Ratings.from_triples), got "
     "list"),
    ("train-other-maps", lambda: _forged_split(train=_OTHER), ValueError,
     "validation must share train's user_map (the parts of one split), got one of 20 users "
     "for their 2"),
]


@pytest.mark.parametrize("how", RELOADS)
@pytest.mark.parametrize("forge, error, message", [c[1:] for c in FORGED_SPLITS],
                         ids=[c[0] for c in FORGED_SPLITS])
def test_a_forged_split_is_refused_when_loaded(forge, error, message, how):
    split = forge()
    parts = dict(vars(split))
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        reload(split, how)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):  # the constructor's words
        Split(parts["train"], parts["validation"], parts["test"])


@pytest.mark.parametrize("how", RELOADS)
def test_a_valid_split_loads_with_its_shared_maps(how):
    split = _forged_split()
    loaded = reload(split, how)
    assert type(loaded) is Split and [len(p) for p in loaded] == [len(p) for p in split]
    assert loaded.train.user_map is loaded.test.user_map is loaded.validation.user_map
    assert loaded.train.user_map == split.train.user_map
    loaded.test = loaded.validation  # still checked when assigned
    with pytest.raises(ValueError, match="^test must share train's user_map"):
        loaded.test = _OTHER


@pytest.mark.parametrize("state, error, message", [
    ({"train": 1, "validation": 2}, ValueError,
     "a loaded Split's state lacks the fields ['test'] (it holds ['train', 'validation'])"),
    (("train", "validation", "test"), TypeError,
     "a loaded Split's state must be a dict of its fields, got tuple"),
])
def test_a_split_state_without_its_fields_is_refused(state, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Split.__new__(Split).__setstate__(state)
