"""A synthetic rating set shaped like MovieLens-100K, generated from a seed.

It is the embedded default of the examples and the data of the tests: no file
to download, the same ratings on every machine.  It reproduces MovieLens-100K's
shape (943 users, 1,682 items, 100,000 ratings, every user with at least 20,
a long tail of rarely rated items, the star shares 6/11/27/34/21 %), with
ratings missing not at random, and its difficulty ladder: on seed 0 the item
mean, a biased matrix factorisation and a dense I-AutoRec land near their
MovieLens-100K figures, in the same order (``docs/models.md`` has the
measured figures and how far they move with the seed).
"""
from __future__ import annotations

from typing import Any, Tuple, cast

import math
import os
import numpy as np
import torch

from .._forms import as_count, as_flag, is_int, is_real, real_float
from .readers import Ratings

__all__ = ["synthetic_ratings", "synthetic_item_features"]

#: MovieLens-100K's star shares, 1 to 5 stars (u.data).
_SHARES = (0.0611, 0.1137, 0.2715, 0.3417, 0.2120)
#: Genres per item in the generator (MovieLens-100K has 19 genre flags).
_GENRES = 19
# Standard deviations of the latent score's parts, chosen so the difficulty
# ladder resembles MovieLens-100K's (see synthetic_ratings and docs/models.md).
_USER_BIAS, _ITEM_BIAS, _GENRE, _INTERACTION = 0.30, 0.58, 0.50, 0.60
#: How much a user's choice of items follows its selection taste (0: not at all).
_SELECTION = 3.5
#: Correlation of a user's selection preferences with its rating preferences:
#: users choose items by the same traits they rate them by, but not by the
#: same liking (what one watches is not only what one likes).
_ALIGNMENT = 0.4


def _user_counts(rng: np.random.Generator, n_users: int, n_items: int, n_ratings: int,
                 sigma: float) -> np.ndarray:
    """Ratings per user: a floor (20, or what fits), the rest by lognormal activity, capped."""
    floor = min(20, n_ratings // n_users, n_items)
    cap = max(int(0.45 * n_items), -(-n_ratings // n_users))  # MovieLens-100K: 737 of 1682
    counts = np.full(n_users, floor, dtype=np.int64)
    weight = rng.lognormal(0.0, sigma, n_users)
    left = n_ratings - counts.sum()
    while left > 0:
        room = cap - counts
        w = np.where(room > 0, weight, 0.0)
        share = np.minimum(np.floor(w / w.sum() * left).astype(np.int64), room)
        if share.sum() == 0:  # the last few: one each to the most active users with room
            order = np.argsort(-w)[:left]
            share = np.zeros_like(counts)
            share[order[room[order] > 0]] = 1
        counts += share
        left = n_ratings - counts.sum()
    return counts


def _pattern(rng: np.random.Generator, n_users: int, n_items: int, n_ratings: int,
             user_sigma: float, item_sigma: float, affinity: np.ndarray
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(user, item, log_popularity)``: each user rates its count of distinct items.

    Items are drawn without replacement with weights proportional to a
    lognormal popularity (Gumbel top-k per user): a long tail of rare items;
    and in proportion to ``exp(_SELECTION * affinity)``, the standardised
    selection taste: which users rated an item says which traits it has
    (missing not at random, as in MovieLens).
    """
    counts = _user_counts(rng, n_users, n_items, n_ratings, user_sigma)
    log_item = rng.normal(0.0, item_sigma, n_items)
    keys = log_item[None, :] + _SELECTION * affinity + rng.gumbel(size=(n_users, n_items))
    order = np.argsort(-keys, axis=1)
    take = np.arange(n_items)[None, :] < counts[:, None]
    user = np.broadcast_to(np.arange(n_users)[:, None], order.shape)[take]
    item = order[take]
    key = user * n_items + item
    key.sort()  # grouped by user, items increasing
    return key // n_items, key % n_items, log_item


def _genres(seed: int, n_items: int) -> np.ndarray:
    """Each item's genre flags ``(n_items, 19)``: one to three genres, some more common."""
    rng = np.random.default_rng([seed, 19])
    popularity = rng.dirichlet(np.full(_GENRES, 0.8))
    flags = np.zeros((n_items, _GENRES), dtype=np.float32)
    n_genres = rng.choice([1, 2, 3], size=n_items, p=[0.5, 0.35, 0.15])
    for i in range(n_items):
        flags[i, rng.choice(_GENRES, size=n_genres[i], replace=False, p=popularity)] = 1.0
    return flags


# The generator is dense: its peak memory, measured with tracemalloc (1000-2000 users,
# 1000-200,000 items, rank 10 and 200), is about 49 bytes a (user, item) cell (float64
# tastes, sort keys and their argsort order) and 100 bytes an item for the genres;
# the factors are float64 (user and item, rating and selection).
_BYTES_PER_CELL, _BYTES_PER_ITEM = 50, 100


def _check_memory(n_users: int, n_items: int, rank: int) -> None:
    """Refuse sizes whose dense generation needs more than this machine's memory (numpy
    would raise MemoryError for some, and swap or be killed for others).
    ``n_users = rank = 0``: the genres alone (:func:`synthetic_item_features`)."""
    need = (_BYTES_PER_CELL * n_users * n_items + _BYTES_PER_ITEM * n_items
            + 8 * 3 * rank * (n_users + n_items))
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: nothing to compare
        return
    if need > have:
        sizes, rate = ((f"n_items={n_items}", f"{_BYTES_PER_ITEM} bytes an item") if not n_users
                       else (f"n_users={n_users}, n_items={n_items}, rank={rank}",
                             f"{_BYTES_PER_CELL} bytes a (user, item) cell"))
        raise ValueError(f"{sizes} need about {need / 2**30:.3g} GiB to generate (the "
                         f"generator is dense: about {rate}), more than this machine's "
                         f"{have / 2**30:.3g} GiB of memory; choose smaller sizes")


def _check_seed(seed: Any) -> None:
    if not is_int(seed):  # (not a numpy timedelta64, which np.integer holds)
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")


def synthetic_item_features(seed: int = 0, n_items: int = 1682) -> torch.Tensor:
    """The genre flags of :func:`synthetic_ratings`'s items: float32 ``(n_items, 19)``.

    The side information of CFN++ on the synthetic set (MovieLens-100K's
    ``u.item`` has 19 genre flags too).

    Args:
        seed (int): as :func:`synthetic_ratings`'s: the same seed gives the
            features of that set's items.  Default: 0.
        n_items (int): the number of items.  Default: 1682.

    Returns:
        Tensor: float32 ``(n_items, 19)`` of 0 and 1, every item in at least one genre.

    Raises:
        TypeError: ``seed`` or ``n_items`` not an int.
        ValueError: a negative ``seed``, ``n_items`` not positive or needing more
            than the machine's memory (about 100 bytes an item).

    Example::

        >>> g = synthetic_item_features(0, n_items=5)
        >>> g.shape, bool((g.sum(1) >= 1).all())
        (torch.Size([5, 19]), True)
    """
    _check_seed(seed)
    n_items = as_count("n_items", n_items, 1, must="positive")
    _check_memory(0, n_items, 0)
    return torch.from_numpy(_genres(seed, n_items))


def _taste(taste: np.ndarray, p: np.ndarray, genres: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``g_ui + <p_u, q_i>``, ``(n_users, n_items)``: a genre taste of std ``_GENRE`` and factors.

    Each user likes or dislikes each genre (``taste``); an item gets the mean
    taste over its genres, saturated by tanh: a strong taste adds little more
    than a clear one.
    """
    genre_score = np.tanh(taste) @ (genres / genres.sum(1, keepdims=True)).T
    genre_score *= _GENRE / (genre_score.std() + 1e-12)
    return cast(np.ndarray, genre_score + p @ q.T)


def _scores(seed: int, n_users: int, n_items: int, n_ratings: int, rank: int, noise: float,
            user_sigma: float, item_sigma: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(user, item, score)``: the noisy latent scores, before they become stars."""
    rng = np.random.default_rng(seed)
    taste_rng = np.random.default_rng([seed, 1])
    genres = _genres(seed, n_items)
    factor_std = np.sqrt(_INTERACTION / np.sqrt(rank))  # so <p_u, q_i> has std _INTERACTION
    taste = taste_rng.normal(0.0, 1.5, (n_users, _GENRES))
    p = taste_rng.normal(0.0, factor_std, (n_users, rank))
    q = taste_rng.normal(0.0, factor_std, (n_items, rank))
    taste_score = _taste(taste, p, genres, q)
    # The selection taste reads the same item traits (genres, q) with user
    # weights only partly aligned with the rating ones: which users rated an
    # item reveals its traits (an item autoencoder reads it from the pattern
    # of its column), without the ratings being merely the liked items'.
    other = np.random.default_rng([seed, 11])
    mix = np.sqrt(1.0 - _ALIGNMENT ** 2)
    select_taste = _ALIGNMENT * taste + mix * other.normal(0.0, 1.5, taste.shape)
    select_p = _ALIGNMENT * p + mix * other.normal(0.0, factor_std, p.shape)
    selection = _taste(select_taste, select_p, genres, q)
    affinity = selection / (selection.std() + 1e-12)
    user, item, log_item = _pattern(rng, n_users, n_items, n_ratings, user_sigma, item_sigma,
                                    affinity)
    user_bias = rng.normal(0.0, _USER_BIAS, n_users)
    # Popular items are rated higher in MovieLens; part of the item bias follows popularity.
    popularity = (log_item - log_item.mean()) / (log_item.std() + 1e-12)
    item_bias = _ITEM_BIAS * (0.5 * popularity + np.sqrt(0.75) * rng.normal(0.0, 1.0, n_items))
    score = user_bias[user] + item_bias[item] + taste_score[user, item]
    return user, item, score + rng.normal(0.0, noise, n_ratings)


def _stars(score: np.ndarray) -> np.ndarray:
    """Cut the scores at the quantiles that give MovieLens-100K's star shares."""
    edges = np.quantile(score, np.cumsum(_SHARES)[:-1])
    return (np.searchsorted(edges, score, side="right") + 1).astype(np.float32)


def synthetic_ratings(seed: int = 0, n_users: int = 943, n_items: int = 1682,
                      n_ratings: int = 100_000, rank: int = 10, noise: float = 0.7,
                      user_sigma: float = 0.9, item_sigma: float = 2.0,
                      titles: bool = True) -> Ratings:
    r"""A deterministic synthetic rating set with MovieLens-100K's shape and difficulty.

    The defaults mimic MovieLens-100K: 943 users, 1,682 items, 100,000
    ratings, integer stars 1 to 5.  The generator, seeded by ``seed``:

    * gives every user at least 20 ratings (fewer when the catalogue or
      ``n_ratings`` is too small), the rest in proportion to a lognormal
      activity (log-std ``user_sigma``);
    * scores each pair ``b_u + b_i + g_ui + <p_u, q_i> + e``: user and item
      biases (std 0.30 and 0.58, the item bias higher for popular items, as
      in real data), a genre-taste term ``g_ui`` (std 0.50; the saturated
      tastes of the user for the item's genres,
      :func:`synthetic_item_features`), rank-``rank`` factors (std 0.60) and
      Gaussian noise ``e`` of std ``noise``; the rating taste is
      ``g_ui + <p_u, q_i>``;
    * lets each user pick distinct items with weights proportional to a
      lognormal popularity (log-std ``item_sigma``: a long tail of rarely
      rated items) times ``exp(3.5 * s_ui)``, ``s_ui`` a standardised
      *selection* taste ``g'_ui + <p'_u, q_i>`` over the same item traits
      (genres, ``q_i``) whose user weights correlate only 0.4 with the
      rating ones (``p'_u = 0.4 p_u + 0.92 z_u``, likewise the genre
      tastes): users choose what they rate by the items' traits, not only
      by how much they will like them.  Which users rated an item thus
      says much about its traits and something about its ratings (missing
      not at random), which an item autoencoder reads from the pattern of
      the item's column and a matrix factorisation of the ratings does not
      (in the measurements of ``docs/models.md`` this is what gives the
      dense I-AutoRec its lead over biased MF, a lead it has on
      MovieLens-100K too);
    * turns the scores into stars at the quantiles that give MovieLens-100K's
      shares: 1★ 6 %, 2★ 11 %, 3★ 27 %, 4★ 34 %, 5★ 21 %.

    Args:
        seed (int): the seed (numpy ``Generator``).  Default: 0.
        n_users (int): number of users.  Default: 943.
        n_items (int): number of items.  Default: 1682.
        n_ratings (int): number of ratings, at most ``n_users * n_items``.
            Default: 100,000.
        rank (int): rank of the interaction term.  Default: 10.
        noise (float): std of the Gaussian noise of the score.  Default: 0.7.
        user_sigma (float): log-std of the user activity.  Default: 0.9.
        item_sigma (float): log-std of the item popularity.  Default: 2.0.
        titles (bool): give the items titles ``"Item <id>"``.  Default: ``True``.

    Returns:
        Ratings: ``n_ratings`` entries with no repeated (user, item) pair,
        sorted by user then item; original ids are ``0..n-1``, so indices and
        ids agree and every user and item has an index, rated or not.

    Raises:
        TypeError: a ``seed`` or a size that is not an int; ``noise``, ``user_sigma``
            or ``item_sigma`` not a real number; ``titles`` not a bool.
        ValueError: a negative ``seed``; a size that is not positive;
            more ratings than cells; a negative or non-finite ``noise``,
            ``user_sigma`` or ``item_sigma``; sizes whose generation needs more
            than the machine's memory (the generator is dense: about 50 bytes
            a (user, item) cell).

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
    _check_seed(seed)
    # Python ints from here: numpy ints' n_users * n_items overflowed (an int32 product
    # went negative: "n_ratings must be at most n_users * n_items = -1794967296")
    n_users, n_items, n_ratings, rank = (
        as_count(name, value, 1, must="positive")
        for value, name in ((n_users, "n_users"), (n_items, "n_items"),
                            (n_ratings, "n_ratings"), (rank, "rank")))
    if n_ratings > n_users * n_items:
        raise ValueError(f"n_ratings must be at most n_users * n_items = {n_users * n_items}, "
                         f"got {n_ratings}")
    _check_memory(n_users, n_items, rank)
    for number, name in ((noise, "noise"), (user_sigma, "user_sigma"), (item_sigma, "item_sigma")):
        if not is_real(number):  # (not a bool, nor a numpy timedelta64)
            raise TypeError(f"{name} must be a real number, got {type(number).__name__} {number!r}")
        if not 0 <= real_float(number) < math.inf:  # also refuses NaN (and 10**400)
            raise ValueError(f"{name} must be non-negative and finite, got {number}")
    # -0.0 passes the check above, and numpy refused it ("scale < 0"): + 0.0 makes it 0.0
    noise, user_sigma, item_sigma = (real_float(v) + 0.0 for v in (noise, user_sigma, item_sigma))
    titles = as_flag(titles, "titles")
    user, item, score = _scores(seed, n_users, n_items, n_ratings, rank, noise,
                                user_sigma, item_sigma)
    return Ratings(torch.from_numpy(user.astype(np.int64)),
                   torch.from_numpy(item.astype(np.int64)), torch.from_numpy(_stars(score)),
                   {u: u for u in range(n_users)}, {i: i for i in range(n_items)},
                   titles=[f"Item {i}" for i in range(n_items)] if titles else None,
                   source=f"synthetic_ratings(seed={seed})")
