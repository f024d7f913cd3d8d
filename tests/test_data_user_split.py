"""Tests of nnsparse.data.user_split: the split by held-out users (Liang et al. 2018)."""
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

from reload import RELOADS, reload
from nnsparse.data import (HeldOut, Ratings, UserSplit, random_split, synthetic_ratings,
                           user_split)


@pytest.fixture(scope="module")
def ratings():
    return synthetic_ratings(seed=1, n_users=80, n_items=50, n_ratings=1500)


def keys(r):
    return (r.user * r.n_items + r.item).tolist()


def parts(split):
    train, valid, test = split
    return [train, valid.fold_in, valid.target, test.fold_in, test.target]


def users(r):
    return set(r.user.tolist())


def test_parts_are_disjoint_and_complete(ratings):
    s = user_split(ratings, test=0.1, validation=0.1, seed=0)
    assert isinstance(s, UserSplit) and isinstance(s.test, HeldOut)
    every = [keys(p) for p in parts(s)]
    assert sum(map(len, every)) == len(ratings)
    assert sorted(k for p in every for k in p) == sorted(keys(ratings))
    position = {k: i for i, k in enumerate(keys(ratings))}
    for p in parts(s):
        assert p.user_map is ratings.user_map and p.item_map is ratings.item_map
        at = [position[k] for k in keys(p)]
        assert at == sorted(at)  # the input's order kept in each part


def test_held_out_users_are_absent_from_train(ratings):
    train, valid, test = user_split(ratings, test=0.15, validation=0.1, seed=2)
    assert users(valid.fold_in) == users(valid.target)
    assert users(test.fold_in) == users(test.target)
    assert not users(train) & users(valid.fold_in)
    assert not users(train) & users(test.fold_in)
    assert not users(valid.fold_in) & users(test.fold_in)
    # every rating of a held-out user is in its fold-in or its target part
    held = users(test.fold_in)
    assert len(test.fold_in) + len(test.target) == sum(u in held for u in ratings.user.tolist())


def test_user_counts_and_ratios(ratings):
    n = len(ratings.user.unique())  # every synthetic user here has >= 2 ratings
    s = user_split(ratings, test=7, validation=3, seed=0)
    assert (len(users(s.test.fold_in)), len(users(s.validation.fold_in))) == (7, 3)
    s = user_split(ratings, test=0.1, validation=0.05, seed=0)
    assert (len(users(s.test.fold_in)), len(users(s.validation.fold_in))) == (
        round(0.1 * n), round(0.05 * n))


@pytest.mark.parametrize("fold_in", [0.5, 0.7, 0.8, 0.9])
def test_per_user_fold_in_fraction(ratings, fold_in):
    _, valid, test = user_split(ratings, test=0.2, validation=0.1, fold_in=fold_in, seed=4)
    per_user = Counter(ratings.user.tolist())
    for part in (valid, test):
        got = Counter(part.target.user.tolist())
        for u, k in got.items():
            n = per_user[u]
            # Liang et al.: int(test_prop * n) targets, in exact arithmetic (their 0.2 * n)
            exact = Fraction(str(round(1 - fold_in, 6))) * n
            assert k == min(max(int(exact), 1), n - 1)


@pytest.mark.parametrize("n, targets", [
    (2, 1), (4, 1), (5, 1), (8, 1), (9, 1), (10, 2), (13, 2), (14, 2), (15, 3), (99, 19),
    (100, 20),
])
def test_targets_as_liang_et_al(n, targets):
    # vae_cf's split_train_test_proportion: int(0.2 * n) targets (round(0.8 * n) fold-in
    # ratings gave 8 ratings 2 targets), at least one of each here (fewer than 5: 1)
    r = Ratings.from_triples([0] * n + [1], list(range(n)) + [0], [1.0] * (n + 1))
    _, _, test = user_split(r, test=1, validation=0, fold_in=0.8, seed=n)
    assert (len(test.fold_in), len(test.target)) == (n - targets, targets)


def test_reproducible_with_the_seed(ratings):
    a = parts(user_split(ratings, seed=7))
    b = parts(user_split(ratings, seed=7))
    c = parts(user_split(ratings, seed=8))
    assert [keys(p) for p in a] == [keys(p) for p in b]
    assert [keys(p) for p in a] != [keys(p) for p in c]
    # the global RNG is neither used nor changed
    state = torch.random.get_rng_state()
    user_split(ratings, seed=7)
    assert torch.equal(state, torch.random.get_rng_state())


def test_fixed_draw_is_pinned():
    # the same seed, the same split on every machine: the draws of torch's seeded CPU
    # generator (randperm), pinned (a change of the draw changes every published split)
    r = Ratings.from_triples([u for u in range(6) for _ in range(4)],
                             [i for _ in range(6) for i in range(4)], [1.0] * 24)
    train, valid, test = user_split(r, test=2, validation=1, fold_in=0.5, seed=0)
    assert test.fold_in.user.tolist() == [2, 2, 5, 5] and test.fold_in.item.tolist() == [0, 3, 0, 3]
    assert valid.fold_in.user.tolist() == [3, 3] and valid.fold_in.item.tolist() == [1, 3]
    assert users(train) == {0, 1, 4} and len(train) == 12


def test_test_users_do_not_depend_on_validation(ratings):
    a = user_split(ratings, test=0.1, validation=0.05, seed=3)
    b = user_split(ratings, test=0.1, validation=0.2, seed=3)
    assert keys(a.test.fold_in) == keys(b.test.fold_in)
    assert keys(a.test.target) == keys(b.test.target)


def test_zero_validation_users(ratings):
    train, valid, test = user_split(ratings, test=0.1, validation=0, seed=0)
    assert len(valid.fold_in) == len(valid.target) == 0
    assert valid.fold_in.user_map is ratings.user_map
    assert len(train) + len(test.fold_in) + len(test.target) == len(ratings)
    # a float 0.0 is the same
    assert keys(user_split(ratings, test=0.1, validation=0.0, seed=0).train) == keys(train)


def test_users_with_one_rating_stay_in_train():
    # users 0..3 rate one item each, 4..9 rate three: only the latter can be held out
    user = [0, 1, 2, 3] + [u for u in range(4, 10) for _ in range(3)]
    item = [0, 1, 2, 3] + [i for _ in range(4, 10) for i in range(3)]
    r = Ratings.from_triples(user, item, [1.0] * len(user))
    for seed in range(5):
        train, valid, test = user_split(r, test=3, validation=3, seed=seed)
        assert {0, 1, 2, 3} <= users(train)
        assert users(test.fold_in) | users(valid.fold_in) == set(range(4, 10))
        # three ratings: floor(0.2 * 3) = 0 targets, raised to the least 1: 2 fold-in, 1 target
        assert len(test.fold_in) == 6 and len(test.target) == 3
    # the ratios count the users that can be held out (6), not all 10
    s = user_split(r, test=0.5, validation=0.0, seed=0)
    assert len(users(s.test.fold_in)) == 3
    with pytest.raises(ValueError, match=r"at most the 6 users with at least 2 ratings"):
        user_split(r, test=4, validation=3)


def test_two_ratings_give_one_and_one():
    r = Ratings.from_triples([0, 0, 1, 1], [0, 1, 0, 1], [1.0] * 4)
    for fold_in in (0.01, 0.5, 0.99):
        _, _, test = user_split(r, test=2, validation=0, fold_in=fold_in)
        assert len(test.fold_in) == 2 and len(test.target) == 2


def test_empty_ratings():
    r = Ratings.from_triples([], [], [])
    train, valid, test = user_split(r)
    assert len(train) == len(valid.fold_in) == len(test.target) == 0
    with pytest.raises(ValueError, match=r"at most the 0 users"):
        user_split(r, test=1)


@pytest.mark.parametrize("test, validation, sizes", [
    (70, 0.125, (70, 10)),     # 0.125 of 80: 10, all 80 held out, as asked
    (0.25, 60, (20, 60)),
    (10, 0.5, (10, 40)),
], ids=["count-fraction-all", "fraction-count-all", "count-fraction"])
def test_a_fraction_beside_a_count_is_its_share(ratings, test, validation, sizes):
    s = user_split(ratings, test=test, validation=validation, seed=0)
    assert (len(users(s.test.fold_in)), len(users(s.validation.fold_in))) == sizes


def test_a_fraction_keeps_a_training_user():
    r = Ratings.from_triples([0, 0, 1, 1], [0, 1, 0, 1], [1.0] * 4)
    train, _, test = user_split(r, test=0.5, validation=0.45)
    assert len(users(train)) == 1 and len(users(test.fold_in)) == 1


def test_under_another_default_device(ratings):
    expected = [keys(p) for p in parts(user_split(ratings, seed=1))]
    with torch.device("meta"):
        got = parts(user_split(ratings, seed=1))
    assert [keys(p) for p in got] == expected


def _twice():
    return Ratings.from_triples([1, 2, 2, 3], [10, 20, 20, 30], [1.0] * 4, source="twice.dat")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(test=-1), ValueError,
     "test must be a number of users (an int >= 0) or a fraction of them in [0, 1), got -1"),
    (dict(test=1.0), ValueError,
     "test must be a number of users (an int >= 0) or a fraction of them in [0, 1), got 1.0 "
     "(for 1 user pass the int 1)"),
    (dict(validation=20.0), ValueError,
     "validation must be a number of users (an int >= 0) or a fraction of them in [0, 1), "
     "got 20.0 (for 20 users pass the int 20)"),
    (dict(validation=-0.1), ValueError,
     "validation must be a number of users (an int >= 0) or a fraction of them in [0, 1), "
     "got -0.1"),
    (dict(validation=float("nan")), ValueError, "validation must be a number of users"),
    (dict(test="3"), TypeError,
     "test must be a number of users (an int) or a fraction of them (a float in [0, 1)), "
     "got str '3'"),
    (dict(validation=True), TypeError,
     "validation must be a number of users (an int) or a fraction of them (a float in "
     "[0, 1)), got bool True"),
    (dict(test=0.6, validation=0.4), ValueError,
     "test + validation must be below 1, got 0.6 + 0.4"),
    (dict(test=70, validation=20), ValueError,
     "test + validation must be at most the 80 users with at least 2 ratings (the users "
     "that can be held out), got 70 + 20 users"),
    # a fraction beside a count is its rounded share, as asked or refused (it was cut to
    # what the count left: validation=0.5 of 80 users gave 10, and no training user)
    (dict(test=70, validation=0.5), ValueError,
     "test + validation must be at most the 80 users with at least 2 ratings (the users "
     "that can be held out), got 70 + 40 users (test=70, validation=0.5)"),
    (dict(test=0.5, validation=41), ValueError,
     "test + validation must be at most the 80 users with at least 2 ratings (the users "
     "that can be held out), got 40 + 41 users (test=0.5, validation=41)"),
    (dict(fold_in=0.0), ValueError, "fold_in must be a number in (0, 1), got 0.0"),
    (dict(fold_in=1), ValueError, "fold_in must be a number in (0, 1), got 1"),
    (dict(fold_in="0.8"), TypeError, "fold_in must be a number in (0, 1), got str '0.8'"),
    (dict(fold_in=None), TypeError, "fold_in must be a number in (0, 1), got NoneType None"),
    (dict(seed=1.0), TypeError, "seed must be an int, got float 1.0"),
    (dict(seed="0"), TypeError, "seed must be an int, got str '0'"),
], ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_bad_arguments(ratings, kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        user_split(ratings, **kwargs)


@pytest.mark.parametrize("call, error, message", [
    (lambda: user_split(keys), TypeError,
     "ratings must be a Ratings record (from read_ratings or Ratings.from_triples), got "
     "function"),
    (lambda: user_split(_twice(), test=1), ValueError,
     "ratings from twice.dat: 1 (user, item) pair rated more than once"),
    (lambda: UserSplit(_twice(), _twice(), HeldOut(_twice(), _twice())), TypeError,
     "validation must be a (fold_in, target) pair of Ratings, got Ratings"),
    (lambda: UserSplit(_twice(), (_twice(), _twice()), (_twice(), keys)), TypeError,
     "test target must be a Ratings record"),
], ids=["not-ratings", "pair-twice", "UserSplit-fields", "UserSplit-test-target"])
def test_bad_records(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_user_split_record_takes_pairs(ratings):
    train, valid, test = user_split(ratings, test=3, validation=2, seed=0)
    s = UserSplit(train, (valid.fold_in, valid.target), (test.fold_in, test.target))
    assert type(s.validation) is HeldOut and type(s.test) is HeldOut
    assert s.validation.target is valid.target and list(s)[0] is train


def test_numpy_numbers_are_taken(ratings):
    a = user_split(ratings, test=np.int64(5), validation=np.float64(0.1), seed=np.int64(3))
    b = user_split(ratings, test=5, validation=0.1, seed=3)
    assert [keys(p) for p in parts(a)] == [keys(p) for p in parts(b)]


def test_a_split_checks_the_pairs_once(ratings):
    # the parts of a record known unique are known unique (bool-mask subsets)
    s = user_split(ratings, seed=0)
    assert all(p._known_unique() for p in parts(s))
    assert len(random_split(s.train, 0.1, 0.1).test) == round(0.1 * len(s.train))


# -- a UserSplit loaded from a file (pickle, copy, torch.load) is checked as the constructor

def _forged_split(split=None, **parts):
    """A user split (``split``, or a new one) with parts set past the checks (as a file
    sets them)."""
    if split is None:
        split = user_split(synthetic_ratings(seed=1, n_users=20, n_items=15, n_ratings=200),
                           test=2, validation=2, seed=0)
    for name, value in parts.items():
        object.__setattr__(split, name, value)
    return split


_OTHER = Ratings.from_triples([1, 2], [1, 2], [4., 5.])

# (id, forged split, error, message): the constructor's message for the same parts
FORGED_SPLITS = [
    ("validation-other-maps", lambda: _forged_split(validation=HeldOut(_OTHER, _OTHER)),
     ValueError, "validation fold_in must share train's user_map (the parts of one split), got "
     "one of 2 users for their 20"),
    ("test-triple", lambda: _forged_split(test=(_OTHER, _OTHER, _OTHER)), TypeError,
     "test must be a (fold_in, target) pair of Ratings, got tuple"),
    ("test-target-not-ratings", lambda: (lambda s: _forged_split(
        s, test=HeldOut(s.test.fold_in, "x")))(_forged_split()), TypeError,
     "test target must be a Ratings record (from read_ratings or Ratings.from_triples), got "
     "str"),
    ("train-other-maps", lambda: _forged_split(train=_OTHER), ValueError,
     "validation fold_in must share train's user_map (the parts of one split), got one of 20 "
     "users for their 2"),
]


@pytest.mark.parametrize("how", RELOADS)
@pytest.mark.parametrize("forge, error, message", [c[1:] for c in FORGED_SPLITS],
                         ids=[c[0] for c in FORGED_SPLITS])
def test_a_forged_user_split_is_refused_when_loaded(forge, error, message, how):
    split = forge()
    parts = dict(vars(split))
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        reload(split, how)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):  # the constructor's words
        UserSplit(parts["train"], parts["validation"], parts["test"])


@pytest.mark.parametrize("how", RELOADS)
def test_a_valid_user_split_loads_with_its_shared_maps(how):
    split = _forged_split()
    loaded = reload(split, how)
    assert type(loaded) is UserSplit and type(loaded.test) is HeldOut
    assert [len(p) for p in parts(loaded)] == [len(p) for p in parts(split)]
    assert all(p.user_map is loaded.train.user_map for p in parts(loaded))
    with pytest.raises(TypeError, match=r"^test must be a \(fold_in, target\) pair"):
        loaded.test = loaded.train  # still checked when assigned


def test_a_user_split_state_without_its_fields_is_refused():
    with pytest.raises(ValueError, match=re.escape(
            "a loaded UserSplit's state lacks the fields ['validation', 'test'] (it holds "
            "['train'])")):
        UserSplit.__new__(UserSplit).__setstate__({"train": 1})
