"""Tests of nnsparse.data.implicit_clicks: explicit ratings made clicks, as Liang et al.'s
Mult-DAE / Mult-VAE preprocessing (``rating > 3.5``, then ``filter_triplets``)."""
import math
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

from nnsparse.data import (Ratings, implicit_clicks, rating_matrix, synthetic_ratings,
                           user_split)


def reference(ratings, threshold, min_user, min_item):
    """Liang et al.'s preprocessing in plain Python, on the (user, item, rating) triples:
    the ratings >= threshold, the items with >= min_item of them, then the users with
    >= min_user of what is left (one pass each).  Returns the kept entries' positions."""
    triples = list(zip(ratings.user.tolist(), ratings.item.tolist(), ratings.rating.tolist()))
    kept = [k for k, (_, _, r) in enumerate(triples) if r >= threshold]
    if min_item > 0:
        per_item = Counter(triples[k][1] for k in kept)
        kept = [k for k in kept if per_item[triples[k][1]] >= min_item]
    if min_user > 0:
        per_user = Counter(triples[k][0] for k in kept)
        kept = [k for k in kept if per_user[triples[k][0]] >= min_user]
    return kept


def half_stars(seed, n=400):
    """ML-20M-like ratings: half stars, users and items of very different counts."""
    g = np.random.default_rng(seed)
    pairs = sorted({(int(g.zipf(1.6)) % 60, int(g.zipf(1.4)) % 40) for _ in range(n)})
    users, items = zip(*pairs)
    return Ratings.from_triples(users, items, g.integers(1, 11, len(pairs)) / 2.0)


def triples(r):
    return list(zip(r.user.tolist(), r.item.tolist(), r.rating.tolist()))


RECORDS = {"synthetic": lambda: synthetic_ratings(seed=3, n_users=60, n_items=80,
                                                  n_ratings=1500),
           "half-stars": lambda: half_stars(0), "half-stars-2": lambda: half_stars(1)}


@pytest.mark.parametrize("record", sorted(RECORDS))
@pytest.mark.parametrize("threshold, min_user, min_item", [
    (4.0, 5, 0), (3.5, 5, 0), (4.0, 0, 0), (4.0, 1, 0), (3, 10, 0), (4.0, 5, 3),
    (4.5, 2, 2), (1, 0, 4), (0.5, 30, 0), (5.0, 1, 1), (6, 0, 0), (-1e9, 0, 0),
])
def test_matches_the_plain_python_reference(record, threshold, min_user, min_item):
    r = RECORDS[record]()
    before = triples(r)
    clicks = implicit_clicks(r, threshold, min_user_clicks=min_user, min_item_clicks=min_item)
    kept = reference(r, threshold, min_user, min_item)
    assert triples(clicks) == [(before[k][0], before[k][1], 1.0) for k in kept]
    assert triples(r) == before  # the input unchanged
    assert clicks.rating.dtype == torch.float32


def test_defaults_are_liang_et_al_s():
    """4.0 at or above (their ``rating > 3.5``), users with >= 5 clicks, no item filter."""
    r = half_stars(2, 800)
    assert triples(implicit_clicks(r)) == triples(implicit_clicks(r, 4.0, min_user_clicks=5,
                                                                  min_item_clicks=0))
    liang = reference(r, math.nextafter(3.5, 5), 5, 0)  # their rating > 3.5
    assert liang != reference(r, 3.5, 5, 0)  # (half stars of 3.5 here: not clicks)
    assert implicit_clicks(r).user.tolist() == [r.user[k].item() for k in liang]


def test_items_are_filtered_first_then_users_once():
    """Liang et al.'s filter_triplets: items by min_sc, then users by min_uc, no k-core."""
    r = Ratings.from_triples([1, 1, 2, 2, 3], [10, 20, 10, 30, 30], [5.0] * 5)
    # item 20 has one click: dropped, so user 1 has one click left and is dropped too;
    # item 10 is then left with one click (user 2's), kept: one pass each
    clicks = implicit_clicks(r, min_user_clicks=2, min_item_clicks=2)
    assert triples(clicks) == [(1, 0, 1.0), (1, 2, 1.0)]


def test_maps_titles_and_source_are_the_input_s():
    r = synthetic_ratings(seed=0, n_users=40, n_items=30, n_ratings=600)
    r.titles = [f"movie {i}" for i in range(r.n_items)]
    r.source = "ml-test"
    clicks = implicit_clicks(r, 4.0, min_user_clicks=8)
    assert clicks.user_map is r.user_map and clicks.item_map is r.item_map
    assert clicks.titles is r.titles and clicks.source == "ml-test"
    assert (clicks.n_users, clicks.n_items) == (r.n_users, r.n_items)
    assert clicks.user_ids() is r.user_ids()  # (the inverse maps shared too)
    dropped = set(r.user.tolist()) - set(clicks.user.tolist())
    assert dropped  # some users are dropped here, and keep their index and map entry
    # a dropped user's row of the matrix is empty; rows= gives the clicking users' only
    m = rating_matrix(clicks, "user")
    assert m.shape == (r.n_users, r.n_items)
    assert all(m.crow_indices()[u] == m.crow_indices()[u + 1] for u in dropped)
    users = torch.unique(clicks.user)
    assert rating_matrix(clicks, "user", rows=users).shape == (len(users), r.n_items)
    assert clicks.rated_in(r).all()  # the same indices as the ratings


def test_user_split_of_the_clicks_never_holds_out_a_dropped_user():
    r = synthetic_ratings(seed=1, n_users=80, n_items=50, n_ratings=1500)
    clicks = implicit_clicks(r, 4.0, min_user_clicks=10)
    kept = set(clicks.user.tolist())
    train, valid, test = user_split(clicks, test=0.2, validation=0.1, seed=0)
    held = set(valid.fold_in.user.tolist()) | set(test.fold_in.user.tolist())
    assert held and held <= kept and set(train.user.tolist()) <= kept
    assert sum(map(len, (train, *valid, *test))) == len(clicks)


def test_the_example_s_former_lines_give_the_same_clicks():
    """examples/implicit_mult_dae.py's hand-written binarisation, which the helper replaced
    (the example's figures depend on the same entries in the same order)."""
    for r in (synthetic_ratings(seed=0), half_stars(3, 900)):
        for threshold, min_clicks in ((4.0, 5), (3.0, 10), (4.5, 3)):
            by_hand = r.subset(r.rating >= threshold)
            per_user = torch.bincount(by_hand.user, minlength=by_hand.n_users)
            by_hand = by_hand.subset(per_user[by_hand.user] >= min_clicks)
            clicks = implicit_clicks(r, threshold, min_user_clicks=min_clicks)
            assert torch.equal(clicks.user, by_hand.user)
            assert torch.equal(clicks.item, by_hand.item)


def test_values_keep_the_ratings_dtype_and_an_empty_result_keeps_the_maps():
    r = Ratings.from_triples([1, 1, 2], [5, 6, 5], [4.0, 2.0, 5.0])
    wide = Ratings(r.user, r.item, r.rating.double(), r.user_map, r.item_map)
    clicks = implicit_clicks(wide, min_user_clicks=1)
    assert clicks.rating.dtype == torch.float64 and clicks.rating.tolist() == [1.0, 1.0]
    none = implicit_clicks(r, 5.5)
    assert len(none) == 0 and none.user_map is r.user_map and none.n_items == 2
    empty = Ratings.from_triples([], [], [])
    assert len(implicit_clicks(empty)) == 0


def test_a_pair_rated_twice_stays_two_clicks():
    twice = Ratings.from_triples([1, 1, 1], [7, 7, 8], [5.0, 4.0, 4.0], source="twice.dat")
    clicks = implicit_clicks(twice, min_user_clicks=3)
    assert triples(clicks) == [(0, 0, 1.0), (0, 0, 1.0), (0, 1, 1.0)]
    with pytest.raises(ValueError, match="1 .user, item. pair rated more than once"):
        user_split(clicks, test=0, validation=0)


def test_a_record_known_unique_stays_known_unique():
    r = synthetic_ratings(seed=0, n_users=30, n_items=20, n_ratings=300)
    user_split(r, test=0, validation=0)  # checks the pairs once, and marks the record
    assert r._known_unique()
    assert implicit_clicks(r, min_user_clicks=2)._known_unique()


@pytest.mark.parametrize("threshold, min_user, min_item", [
    (np.float32(4.0), np.int64(5), np.int32(0)), (Fraction(7, 2), 5, 0), (4, 5, 0),
    (torch.tensor(4.0).item(), torch.tensor(5), np.array(0)),
], ids=["numpy", "fraction", "int", "0-d"])
def test_numbers_of_other_kinds(threshold, min_user, min_item):
    r = half_stars(4)
    got = implicit_clicks(r, threshold, min_user_clicks=min_user, min_item_clicks=min_item)
    kept = reference(r, float(threshold), int(min_user), int(min_item))
    assert triples(got) == [(*triples(r)[k][:2], 1.0) for k in kept]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(threshold="4"), TypeError, "threshold must be a finite number (the lowest rating "
     "that is a click), got str '4'"),
    (dict(threshold=None), TypeError, "threshold must be a finite number (the lowest rating "
     "that is a click), got NoneType None"),
    (dict(threshold=True), TypeError, "threshold must be a finite number (the lowest rating "
     "that is a click), got bool True"),
    (dict(threshold=torch.tensor(4.0)), TypeError, "threshold must be a finite number (the "
     "lowest rating that is a click), got Tensor tensor(4.)"),
    (dict(threshold=np.timedelta64(4)), TypeError, "threshold must be a finite number (the "
     "lowest rating that is a click), got timedelta64"),
    (dict(threshold=float("nan")), ValueError, "threshold must be a finite number (the "
     "lowest rating that is a click), got nan"),
    (dict(threshold=-math.inf), ValueError, "threshold must be a finite number (the lowest "
     "rating that is a click), got -inf"),
    (dict(threshold=2 ** 1024), ValueError, "threshold must be a finite number (the lowest "
     "rating that is a click), got 1797693"),
    (dict(min_user_clicks=-1), ValueError, "min_user_clicks must be a non-negative int, "
     "got -1"),
    (dict(min_user_clicks=5.0), TypeError, "min_user_clicks must be a non-negative int, "
     "got 5.0"),
    (dict(min_user_clicks=True), TypeError, "min_user_clicks must be a non-negative int, "
     "got True"),
    (dict(min_user_clicks=2 ** 63), ValueError, "min_user_clicks must be a non-negative int "
     "within int64 (below 2**63), got 9223372036854775808"),
    (dict(min_item_clicks=-2), ValueError, "min_item_clicks must be a non-negative int, "
     "got -2"),
    (dict(min_item_clicks="1"), TypeError, "min_item_clicks must be a non-negative int, "
     "got '1'"),
    (dict(ratings=[(1, 2, 4.0)]), TypeError, "ratings must be a Ratings record (from "
     "read_ratings or Ratings.from_triples), got list"),
], ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_bad_arguments(kwargs, error, message):
    r = Ratings.from_triples([1, 1, 2], [5, 6, 5], [4.0, 2.0, 5.0])
    before = triples(r)
    kwargs = {"ratings": r, **kwargs}
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        implicit_clicks(**kwargs)
    assert triples(r) == before


def test_min_counts_are_keyword_only():
    r = Ratings.from_triples([1], [5], [4.0])
    with pytest.raises(TypeError, match="positional"):
        implicit_clicks(r, 4.0, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_on_cuda_the_clicks_stay_there():
    r = half_stars(5)
    on = Ratings(r.user.cuda(), r.item.cuda(), r.rating.cuda(), r.user_map, r.item_map)
    clicks = implicit_clicks(on, 3.5, min_user_clicks=3, min_item_clicks=2)
    assert clicks.user.is_cuda and clicks.rating.is_cuda
    assert triples(clicks) == triples(implicit_clicks(r, 3.5, min_user_clicks=3,
                                                      min_item_clicks=2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64])
@pytest.mark.parametrize("threshold", [3.99, 4.0000001, 3.9999999, 4.01, 3.5, 4.0, 65505.0,
                                       65520.0, 1e6, -1e6, 1e-8, -0.0])
def test_the_threshold_is_compared_exactly_in_the_ratings_dtype(dtype, threshold):
    """torch rounds a Python number to the tensor's dtype before comparing (a bfloat16
    3.984375 >= 3.99 would hold): each rating is kept exactly when its value, read as a
    float, is >= threshold, against the plain-python reference."""
    values = torch.tensor([3.984375, 3.99, 4.0, 4.0000001, 3.9999999, 4.0078125, 4.01,
                           65504.0, 1e-8, 0.0, -1.0, 5.0], dtype=torch.float64).to(dtype)
    n = values.numel()
    r = Ratings(torch.arange(n), torch.zeros(n, dtype=torch.long), values,
                {u: u for u in range(n)}, {0: 0})
    clicks = implicit_clicks(r, threshold, min_user_clicks=0)
    kept = [u for u, v in enumerate(values.tolist()) if v >= threshold]
    assert clicks.user.tolist() == kept
    assert clicks.rating.dtype == dtype and clicks.rating.tolist() == [1.0] * len(kept)
