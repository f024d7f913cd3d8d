"""Tests of nnsparse.data.split: seeded, disjoint, complete splits sharing one id map."""
import pytest
import torch

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
