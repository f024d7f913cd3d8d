"""Explicit ratings made implicit feedback: the clicks of the implicit-feedback models.

Mult-DAE / Mult-VAE (Liang et al., WWW 2018), EASE (Steck, WWW 2019) and RecBole's
implicit pipelines read a rating at or above a threshold as a click, drop the others and
the users with too few clicks: :func:`implicit_clicks`.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from .._forms import as_count, is_real, real_float
from .readers import Ratings, _check_ratings

__all__ = ["implicit_clicks"]


def implicit_clicks(ratings: Ratings, threshold: float = 4.0, *, min_user_clicks: int = 5,
                    min_item_clicks: int = 0) -> Ratings:
    r"""The clicks of explicit ratings: each rating ``>= threshold`` a click of value 1, the
    other ratings dropped, then the users (and items) with too few clicks dropped.

    The preprocessing of Liang et al.'s Mult-DAE / Mult-VAE code, which EASE and
    RecBole's implicit pipelines share: keep ``rating > 3.5`` (ratings of 4 and 5 on
    MovieLens's stars, 4, 4.5 and 5 on ML-10M's and ML-20M's half stars; here
    ``threshold=4.0``, at or above it, as RecBole's ``threshold`` and
    ``examples/implicit_mult_dae.py``'s ``--threshold``), then ``filter_triplets(min_uc=5,
    min_sc=0)``: the items with fewer than ``min_item_clicks`` clicks are dropped first,
    then the users with fewer than ``min_user_clicks`` clicks, one pass each (as their
    code; not repeated until every count holds, a "k-core": dropping users may leave an
    item below ``min_item_clicks``).

    Named for what it returns, as the package's other names (``synthetic_ratings``,
    ``rating_matrix``, ``user_split``): not ``binarize``, whose scikit-learn namesake
    keeps ``> threshold`` and no filter, nor ``to_clicks``, a conversion's name where
    entries and users are dropped too.

    The id maps are kept, the same objects as the input's (as :meth:`Ratings.subset`
    keeps them), with the titles and the source: a dropped user or item keeps its index
    and map entry, with no click.  So the clicks index items as the ratings do
    (``clicks.rated_in(ratings)``, features read for the ratings' ``item_map``), and a
    later :func:`~nnsparse.data.user_split` is correct: it never holds out a user
    with fewer than two ratings, so a dropped user stays in ``train`` with none.  The
    matrix of the users with clicks only, no empty row for the dropped ones (which a
    ``"batchmean"`` loss would count), is ``rating_matrix(part, "user",
    rows=torch.unique(part.user))``.

    Args:
        ratings (Ratings): explicit ratings, on any device.
        threshold (float): the lowest rating that is a click (``rating >= threshold``),
            finite.  Default: 4.0 (Liang et al.'s ``rating > 3.5`` on MovieLens).
        min_user_clicks (int): users with fewer clicks are dropped, ``>= 0``.
            Default: 5 (Liang et al.'s ``min_uc``).
        min_item_clicks (int): items with fewer clicks are dropped (before the users
            are counted), ``>= 0``.  Default: 0 (Liang et al.'s ``min_sc``: none).

    Returns:
        Ratings: the clicks, in the input's order, each of value 1 (the ratings'
        dtype and device), sharing ``ratings``' id maps and titles.  A (user, item)
        pair rated twice stays two clicks (the splits and ``rating_matrix`` refuse it).
        The input is not changed.

    Raises:
        TypeError: ``ratings`` is not a :class:`Ratings` record; ``threshold`` is not
            a real number; a minimum count is not an int (a bool or a float neither).
        ValueError: ``threshold`` is NaN or infinite; a negative minimum count.

    Example::

        >>> from nnsparse.data import Ratings, implicit_clicks
        >>> r = Ratings.from_triples([1, 1, 1, 2, 2, 3], [10, 20, 30, 10, 20, 30],
        ...                          [5., 4., 2., 4.5, 3., 1.])
        >>> clicks = implicit_clicks(r, 4.0, min_user_clicks=2)
        >>> clicks.user.tolist(), clicks.item.tolist(), clicks.rating.tolist()
        ([0, 0], [0, 1], [1.0, 1.0])
        >>> clicks.n_users, clicks.user_map is r.user_map  # users 2 and 3 dropped, ids kept
        (3, True)
        >>> len(implicit_clicks(r, 4.0, min_user_clicks=1))  # user 2's 4.5 is a click too
        3
    """
    _check_ratings(ratings, "ratings")
    if not is_real(threshold):  # (not a bool, a str, None, a numpy timedelta64)
        raise TypeError(f"threshold must be a finite number (the lowest rating that is a "
                        f"click), got {type(threshold).__name__} {threshold!r}")
    if not math.isfinite(real_float(threshold)):
        raise ValueError(f"threshold must be a finite number (the lowest rating that is a "
                         f"click), got {threshold!r}")
    min_user = as_count("min_user_clicks", min_user_clicks, 0, must="non-negative")
    min_item = as_count("min_item_clicks", min_item_clicks, 0, must="non-negative")
    keep = _at_least(ratings.rating.detach(), real_float(threshold))
    if min_item > 0:
        counts = torch.bincount(ratings.item[keep], minlength=ratings.n_items)
        keep &= counts[ratings.item] >= min_item
    if min_user > 0:
        counts = torch.bincount(ratings.user[keep], minlength=ratings.n_users)
        keep &= counts[ratings.user] >= min_user
    part = ratings.subset(keep)  # (the maps, titles and source shared, uniqueness kept)
    clicks = replace(part, rating=torch.ones_like(part.rating), _ids=ratings._ids)
    if part._known_unique():
        clicks._mark_unique()
    return clicks


def _at_least(rating: Tensor, threshold: float) -> Tensor:
    """``rating >= threshold`` exactly, in ``rating``'s dtype: torch compares a tensor
    with a Python number after rounding the number to the tensor's dtype (a bfloat16
    3.984375 ``>= 3.99`` holds, 3.99 rounding to 3.984375; a float32 4.0 ``>=
    4.0000001`` too).  The threshold rounded to the dtype lies next to it, below or not
    (rounding is monotonic): no rating of the dtype between them, so ``rating >=
    threshold`` is ``rating > bound`` where the bound is below, else ``rating >= bound``
    (an infinite bound where the threshold is beyond the dtype's range included)."""
    bound = torch.tensor(threshold, dtype=torch.float64).to(rating.dtype)
    return rating > bound if float(bound) < threshold else rating >= bound
