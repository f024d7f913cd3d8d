"""Tests of nnsparse.data.synthetic: deterministic, MovieLens-like, learnable."""
import pytest
import torch

from nnsparse.data import (Ratings, mean_prediction, rmse, split_ratings, synthetic_item_features,
                           synthetic_ratings)


@pytest.fixture(scope="module")
def default():
    return synthetic_ratings()


def test_default_shape(default):
    assert isinstance(default, Ratings)
    assert (len(default), default.n_users, default.n_items) == (100_000, 943, 1682)
    assert default.user.dtype == default.item.dtype == torch.int64
    assert default.rating.dtype == torch.float32
    assert set(default.rating.unique().tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert default.titles[17] == "Item 17" and len(default.titles) == 1682
    assert int(default.user.max()) < 943 and int(default.item.max()) < 1682


def test_no_duplicate_pairs(default):
    key = default.user * default.n_items + default.item
    assert key.unique().numel() == len(default)


def test_deterministic(default):
    again = synthetic_ratings(seed=0)
    assert torch.equal(default.user, again.user) and torch.equal(default.item, again.item)
    assert torch.equal(default.rating, again.rating)
    other = synthetic_ratings(seed=1)
    assert not torch.equal(default.rating[:1000], other.rating[:1000]) or \
        not torch.equal(default.item[:1000], other.item[:1000])


def test_statistics(default):
    counts = torch.bincount(default.item, minlength=default.n_items).sort(descending=True).values
    assert counts[:168].sum() > 0.3 * len(default)  # long tail: top 10% items > 30% of ratings
    users = torch.bincount(default.user, minlength=default.n_users).sort(descending=True).values
    assert users[:94].sum() > 0.2 * len(default) and users[-1] >= 1
    mean, std = float(default.rating.mean()), float(default.rating.std())
    assert 3.3 < mean < 3.8 and 0.9 < std < 1.3


def test_learnable_baseline(default):
    # The item mean explains part of the ratings, not all: RMSE around 1.
    train, test = split_ratings(default, 0.1, seed=0)
    item = float(rmse(mean_prediction(train, test), test.rating))
    overall = float(rmse(torch.full_like(test.rating, float(train.rating.mean())), test.rating))
    assert 0.95 < item < 1.1 and item < overall - 0.02


def test_small_and_options():
    r = synthetic_ratings(seed=5, n_users=10, n_items=8, n_ratings=80, titles=False)
    assert len(r) == 80 and r.titles is None  # every cell rated
    assert (r.user * 8 + r.item).unique().numel() == 80


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_users=0), ValueError, "n_users must be a positive int, got 0"),
    (dict(n_items=2.5), TypeError, "n_items must be a positive int, got 2.5"),
    (dict(n_ratings="9"), TypeError, "n_ratings must be a positive int, got '9'"),
    (dict(n_users=True), TypeError, "n_users must be a positive int, got True"),
    (dict(rank=2 ** 63), ValueError, r"rank must be a positive int within int64 \(below 2\*\*63\)"),
    (dict(n_users=3, n_items=3, n_ratings=10), ValueError,
     "n_ratings must be at most n_users \\* n_items = 9"),
    (dict(noise=-1.0), ValueError, "noise must be non-negative"),
])
def test_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        synthetic_ratings(**kwargs)


def test_numpy_int_sizes_are_python_ints():
    # int8 100 * 100 wrapped to 16: "n_ratings must be at most n_users * n_items = 16, got 50"
    import numpy as np
    r = synthetic_ratings(n_users=np.int8(100), n_items=np.int8(100), n_ratings=50)
    same = synthetic_ratings(n_users=100, n_items=100, n_ratings=50)
    assert (len(r), r.n_users, r.n_items) == (50, 100, 100)
    assert torch.equal(r.rating, same.rating) and torch.equal(r.item, same.item)
    with pytest.raises(ValueError, match=r"n_users \* n_items = 16, got 17"):
        synthetic_ratings(n_users=np.int8(4), n_items=np.int8(4), n_ratings=np.int8(17))


def test_movielens_100k_shape(default):
    per_user = torch.bincount(default.user, minlength=default.n_users)
    assert int(per_user.min()) >= 20
    shares = [float((default.rating == s).float().mean()) for s in range(1, 6)]
    assert shares == pytest.approx([0.0611, 0.1137, 0.2715, 0.3417, 0.2120], abs=0.005)
    per_item = torch.bincount(default.item, minlength=default.n_items)
    assert int((per_item <= 3).sum()) > 50            # a long tail of rarely rated items
    assert int(per_item.max()) > 10 * float(per_item.float().median())


def test_audience_reveals_the_genres(default):
    # Users choose items by their traits: two items sharing a genre have more
    # raters in common than two items with none in common (the implicit signal
    # an item autoencoder reads).  Measured: 0.176 against 0.124 (ratio 1.42);
    # with no selection by taste the ratio is 0.97, with the previous generator
    # (selection by the rating taste, exp(1.5 * taste)) 1.21.
    rated = torch.zeros(default.n_items, default.n_users)
    rated[default.item, default.user] = 1.0
    keep = rated.sum(1) >= 20
    unit = rated[keep] / rated[keep].norm(dim=1, keepdim=True)
    cosine = unit @ unit.T
    genres = synthetic_item_features(0)[keep]
    share = (genres @ genres.T) > 0
    share.fill_diagonal_(False)
    disjoint = (genres @ genres.T) == 0
    assert float(cosine[share].mean()) > 1.3 * float(cosine[disjoint].mean())
