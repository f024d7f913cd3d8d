"""A synthetic rating set shaped like MovieLens-100K, generated from a seed.

It is the embedded default of the examples and the data of the tests: no file
to download, the same ratings on every machine.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from .readers import Ratings

__all__ = ["synthetic_ratings"]

# The score model, chosen so the statistics resemble MovieLens-100K (mean 3.53,
# std 1.13, item-mean baseline RMSE about 1.0): see synthetic_ratings.
_MEAN, _USER_BIAS, _ITEM_BIAS, _INTERACTION = 3.4, 0.35, 0.45, 0.55


def _check_positive(value: int, name: str) -> None:
    if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _pattern(rng: np.random.Generator, n_users: int, n_items: int, n_ratings: int,
             user_sigma: float, item_sigma: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which (user, item) pairs are rated, and the items' log-popularity.

    Each user has a lognormal activity, each item a lognormal popularity;
    ``n_ratings`` distinct cells are drawn without replacement with weights
    ``activity * popularity`` (Gumbel top-k, one pass over the cells).
    """
    log_user = rng.normal(0.0, user_sigma, n_users)
    log_item = rng.normal(0.0, item_sigma, n_items)
    keys = (log_user[:, None] + log_item[None, :]).ravel()
    keys += rng.gumbel(size=keys.shape)
    cells = np.argpartition(keys, -n_ratings)[-n_ratings:]
    cells.sort()  # row-major: grouped by user, items increasing
    return cells // n_items, cells % n_items, log_item



def _scores(seed: int, n_users: int, n_items: int, n_ratings: int, rank: int, noise: float,
            user_sigma: float, item_sigma: float
            ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(user, item, score)``: the noisy scores, before rounding and clipping.

    The noise is drawn last, so ``noise=0`` gives the noiseless scores of the
    same seed (what the best possible prediction knows).
    """
    rng = np.random.default_rng(seed)
    user, item, log_item = _pattern(rng, n_users, n_items, n_ratings, user_sigma, item_sigma)
    user_bias = rng.normal(0.0, _USER_BIAS, n_users)
    # Popular items are rated higher in MovieLens; part of the item bias follows popularity.
    popularity = (log_item - log_item.mean()) / (log_item.std() + 1e-12)
    item_bias = _ITEM_BIAS * (0.5 * popularity + np.sqrt(0.75) * rng.normal(0.0, 1.0, n_items))
    factor_std = np.sqrt(_INTERACTION / np.sqrt(rank))  # so <p_u, q_i> has std _INTERACTION
    p = rng.normal(0.0, factor_std, (n_users, rank))
    q = rng.normal(0.0, factor_std, (n_items, rank))
    score = _MEAN + user_bias[user] + item_bias[item] + np.einsum("ij,ij->i", p[user], q[item])
    return user, item, score + rng.normal(0.0, noise, n_ratings)


def synthetic_ratings(seed: int = 0, n_users: int = 943, n_items: int = 1682,
                      n_ratings: int = 100_000, rank: int = 10, noise: float = 0.9,
                      user_sigma: float = 1.0, item_sigma: float = 1.3,
                      titles: bool = True) -> Ratings:
    r"""A deterministic synthetic rating set with MovieLens-like statistics.

    The defaults mimic MovieLens-100K: 943 users, 1682 items, 100,000
    ratings, integer stars 1 to 5.  The generator, seeded by ``seed``:

    * draws a lognormal activity per user and popularity per item, and picks
      ``n_ratings`` distinct (user, item) pairs with weights proportional to
      their product: a long tail of rarely rated items and light users;
    * scores each pair ``3.4 + b_u + b_i + <p_u, q_i> + e``, with user biases
      ``b_u`` (std 0.35), item biases ``b_i`` (std 0.45, higher for popular
      items, as in real data), rank-``rank`` factors whose product has
      std 0.55, and Gaussian noise ``e`` of std ``noise``;
    * rounds the score to the nearest star and clips it to 1..5.

    With the defaults (seed 0) the ratings have mean 3.55 and std 1.10
    (MovieLens-100K: 3.53 and 1.13); on a random 10% test part, predicting
    each item's training mean gives an RMSE of 1.04, a rank-10 biased matrix
    factorisation about 0.96, and the best possible prediction (the expected
    star given the noiseless score) 0.86.

    Args:
        seed (int): the seed (numpy ``Generator``).  Default: 0.
        n_users (int): number of users.  Default: 943.
        n_items (int): number of items.  Default: 1682.
        n_ratings (int): number of ratings, at most ``n_users * n_items``.
            Default: 100,000.
        rank (int): rank of the interaction term.  Default: 10.
        noise (float): std of the Gaussian noise before rounding.  Default: 0.9.
        user_sigma (float): log-std of the user activity (the long tail of
            users).  Default: 1.0.
        item_sigma (float): log-std of the item popularity.  Default: 1.3.
        titles (bool): give the items titles ``"Item <id>"``.  Default: ``True``.

    Returns:
        Ratings: ``n_ratings`` entries with no repeated (user, item) pair,
        sorted by user then item; original ids are ``0..n-1``, so indices and
        ids agree and every user and item has an index, rated or not.

    Raises:
        ValueError: a non-positive size, or more ratings than cells.

    Example::

        >>> r = synthetic_ratings(seed=0, n_users=50, n_items=40, n_ratings=300)
        >>> len(r), r.n_users, r.n_items, r.scale
        (300, 50, 40, (1.0, 5.0))
        >>> torch.equal(r.rating, synthetic_ratings(seed=0, n_users=50, n_items=40,
        ...                                         n_ratings=300).rating)
        True
        >>> r.titles[7]
        'Item 7'
    """
    for value, name in ((n_users, "n_users"), (n_items, "n_items"), (n_ratings, "n_ratings"),
                        (rank, "rank")):
        _check_positive(value, name)
    if n_ratings > n_users * n_items:
        raise ValueError(f"n_ratings must be at most n_users * n_items = {n_users * n_items}, "
                         f"got {n_ratings}")
    if noise < 0:
        raise ValueError(f"noise must be non-negative, got {noise}")
    user, item, score = _scores(seed, n_users, n_items, n_ratings, rank, noise,
                                user_sigma, item_sigma)
    stars = np.clip(np.rint(score), 1, 5).astype(np.float32)
    record = Ratings(torch.from_numpy(user.astype(np.int64)),
                     torch.from_numpy(item.astype(np.int64)), torch.from_numpy(stars),
                     {u: u for u in range(n_users)}, {i: i for i in range(n_items)},
                     source=f"synthetic_ratings(seed={seed})")
    if titles:
        record.titles = [f"Item {i}" for i in range(n_items)]
    return record
