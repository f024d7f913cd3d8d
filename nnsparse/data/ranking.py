"""Top-k ranking figures of recommendation lists against held-out ratings.

:func:`ranking_metrics` scores lists a network of your own made (``torch.topk`` of its
scores, :meth:`~nnsparse.Batchifier.topk`); :meth:`RatingModel.evaluate_ranking
<nnsparse.models.RatingModel.evaluate_ranking>` computes the model zoo's lists and scores
them with the same code (:func:`_figures`), so the figures of the two agree.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from .._forms import as_choice, as_count, int_dtype, is_real, real_float, refuse_meta
from .readers import (Ratings, _check_ratings, _check_unique_pairs, _distinct_index,
                      _isin_argument, _positions)

__all__ = ["ranking_metrics"]


def _checked_threshold(threshold: Any, name: str = "threshold") -> Optional[float]:
    """A ranking's ``threshold`` (:func:`ranking_metrics`,
    :meth:`~nnsparse.models.RatingModel.evaluate_ranking`,
    :func:`~nnsparse.models.cross_validate`, ``CrossValidation.threshold``: ``name``) as a
    float, or ``None``: ``TypeError`` unless a real number or ``None``, ``ValueError``
    unless finite (``10**400`` too, where ``math.isfinite`` raised ``OverflowError``)."""
    if threshold is None:
        return None
    if not is_real(threshold):  # (the models' _check_number message)
        raise TypeError(f"{name} must be a real number or None, got "
                        f"{type(threshold).__name__} {threshold!r}")
    number = real_float(threshold)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite or None, got {threshold}")
    return number


def _relevant(test: Ratings, threshold: Optional[float]) -> Tuple[Tensor, Tensor]:
    """The relevant test pairs ``(user, item)`` (CPU int64): every rating of ``test``
    (``threshold=None``) or those ``>= threshold``; ``ValueError`` when ``test`` is empty
    or none reaches ``threshold`` (:func:`ranking_metrics`' and
    :meth:`~nnsparse.models.RatingModel.evaluate_ranking`'s refusal)."""
    if len(test) == 0:
        raise ValueError("test holds no ratings; there is nothing to rank")
    user, item = test.user.cpu(), test.item.cpu()
    if threshold is None:
        return user, item
    relevant = test.rating.detach().cpu() >= threshold
    if not bool(relevant.any()):
        raise ValueError(f"test holds no relevant rating: none of its {len(test)} ratings "
                         f"is >= threshold {threshold:g} (the highest is "
                         f"{float(test.rating.detach().max()):g}); lower threshold, or "
                         f"pass None to count every test rating relevant")
    return user[relevant], item[relevant]


def _figures(top: Tensor, placed: Tensor, users: Tensor, user: Tensor, item: Tensor,
             n_items: int, k: int, recall: str = "n") -> Dict[str, Any]:
    """Precision, recall, NDCG and hit rate at ``k``, averaged over ``users``.

    ``top`` (CPU int64 ``(len(users), columns)``, ``columns <= k``; a narrower list's
    missing places are misses, the ideal list still ``min(k, n)`` long) holds each evaluated
    user's items best first, ``placed`` (bool, same shape) marks the places that hold an
    item (the others are misses); ``users`` are the evaluated users, sorted and unique,
    ``(user, item)`` their relevant test pairs (CPU int64, no pair twice: ``n`` counts
    them), every index of either below ``n_items``; ``recall`` ``"n"`` divides the hits by
    ``n``, ``"min"`` by ``min(k, n)`` (:func:`ranking_metrics`' ``recall``)."""
    position = torch.searchsorted(users, user)
    wanted = torch.unique(position * n_items + item)  # sorted, one key a relevant pair
    key = torch.arange(users.shape[0])[:, None] * n_items + top.clamp(min=0)
    hit = placed & torch.isin(key, wanted)
    n_relevant = torch.bincount(position, minlength=users.shape[0]).double()
    hits = hit.sum(1).double()
    # the ideal list holds min(k, n) relevant items, whatever top's width (a list cut
    # short is a miss; never longer than the catalogue, which holds the n relevant ones)
    best = n_relevant.clamp(max=k).long()
    discount = 1.0 / torch.log2(torch.arange(max(top.shape[1], int(best.max())),
                                             dtype=torch.float64) + 2.0)
    dcg = (hit.double() * discount[:top.shape[1]]).sum(1)
    ideal = discount.cumsum(0)[best - 1]
    return {f"precision@{k}": float((hits / k).mean()),
            f"recall@{k}": float((hits / (n_relevant if recall == "n"
                                          else n_relevant.clamp(max=k))).mean()),
            f"ndcg@{k}": float((dcg / ideal).mean()),
            f"hit_rate@{k}": float((hits > 0).double().mean()),
            "users": int(users.shape[0])}


def _rows_of(users: Any, rows: int, n_users: int, evaluated: Tensor,
             device: torch.device) -> Tensor:
    """The row of ``top`` of each ``evaluated`` user (sorted CPU int64) by ``users``
    (:func:`ranking_metrics`' argument, checked here: ``rows`` distinct user indices in
    ``[0, n_users)``), by one sort of ``users`` and :func:`_positions`: O((rows + users)
    log rows) at most, whatever ``n_users``; the refusal's
    fix writes ``users`` as a tensor on ``device`` (``test.user``'s)."""
    listed, order = _distinct_index(users, "users", n_users, "user")
    listed, order = listed.detach().cpu().long(), order.cpu()
    if listed.shape[0] != rows:
        raise ValueError(f"users must name the user of each row of top, so {rows} users, "
                         f"got {listed.shape[0]}")
    row, found = _positions(listed, order, evaluated, n_users)
    if not bool(found.all()):
        missing = evaluated[~found]
        more = missing.numel() - 1
        others = f", nor for {more} other test user{'s' if more > 1 else ''}" if more else ""
        raise ValueError(f"users must hold every test user with a relevant rating (row j of "
                         f"top: user users[j]'s list), got no row for user "
                         f"{int(missing[0])}{others}; score a part of the users by selecting "
                         f"their test ratings: test.subset(torch.isin(test.user, "
                         f"{_isin_argument(users, 'users', device)}))")
    return row


def ranking_metrics(top: Any, test: Ratings, k: Optional[int] = None, *,
                    threshold: Optional[float] = None, recall: str = "n",
                    users: Any = None) -> Dict[str, Any]:
    r"""Precision, recall, NDCG and hit rate at ``k`` of your own top-``k`` lists.

    The figures :meth:`RatingModel.evaluate_ranking
    <nnsparse.models.RatingModel.evaluate_ranking>` reports, for a network that is not a
    model of :mod:`nnsparse.models`: rank the items for every user yourself (leaving out
    the items the user rated in training, as the full-ranking protocol does), then score
    the lists against held-out ratings.  Every user with a relevant test rating is
    evaluated (a user with none is left out of the means and of ``"users"``, and its row of
    ``top`` is not read); the figures are means over these users, with binary relevance:
    ``precision@k = hits / k``, ``recall@k = hits / n`` (``n`` the user's relevant test
    items; ``recall="min"``: ``hits / min(k, n)``), ``ndcg@k = DCG / IDCG`` (``DCG`` the
    sum of ``1 / log2(p + 1)`` over the hits' positions ``p = 1..k``, ``IDCG`` the same
    over ``p = 1..min(k, n)``) and ``hit_rate@k`` (1 when ``hits >= 1``).

    ``top``'s row ``u`` is user index ``u``'s list, unless ``users`` names each row's user:
    the lists of some users only (the held-out users of
    :func:`~nnsparse.data.user_split`), with no row for the others.  Either way every
    evaluated user needs its list: a test user with a relevant rating and no row
    (beyond ``top``'s rows, or not in ``users``) is refused, never silently left out of
    the means; score a part of the users by selecting their test ratings
    (``test.subset(torch.isin(test.user, torch.as_tensor(users)))``).

    Args:
        top: each user's items, best first: an integer tensor ``(rows, columns)`` whose
            row ``u`` is user index ``u``'s list (``Ratings.user``'s indices; every test
            user needs a row; with ``users``, row ``j`` is user ``users[j]``'s list),
            item indices as ``Ratings.item`` holds them; or a
            ``(values, indices)`` result of :func:`torch.topk`, :func:`nnsparse.stopk`
            or :meth:`nnsparse.Batchifier.topk`.  A place whose index is negative
            (``stopk``'s padding) or whose value is ``-inf`` or NaN (``Batchifier.topk``'s
            padding after ``exclude``) holds no item: a miss.  An item may appear once in
            a row.
        test (Ratings): the held-out ratings, in the index space of ``top``.
        k (int, optional): the length of the lists; ``top``'s first ``k`` columns are
            read, and a ``top`` narrower than ``k`` (a catalogue smaller than ``k``)
            counts its missing places as misses.  Default: ``top``'s number of columns.
        threshold (float, optional): the lowest relevant rating; ``None``: every test
            rating is relevant.  Default: ``None``.
        recall (str): recall's denominator: ``"n"``, the user's relevant test items (the
            textbook recall, :meth:`~nnsparse.models.RatingModel.evaluate_ranking`'s), or
            ``"min"``, ``min(k, n)``: the Recall@k of Liang et al. 2018 (Mult-VAE) and
            of the implicit-feedback papers that follow it, which reaches 1 when the list
            is all hits even for a user with more than ``k`` relevant items.  Default:
            ``"n"``.
        users (Tensor or sequence, optional): the user index of each row of ``top``: a
            1-D integer tensor (on any device) or a sequence of ints, ``top.shape[0]``
            long, each user once, in ``[0, test.n_users)``, in any order; it must hold
            every test user with a relevant rating (a listed user with none is not
            evaluated and its row not read, as without ``users``).  Default: ``None``,
            row ``u`` is user ``u``'s.

    Returns:
        dict: ``{"precision@k", "recall@k", "ndcg@k", "hit_rate@k"}`` (floats; the keys
        carry the value of ``k``) and ``"users"``, the number of evaluated users.

    Raises:
        TypeError: ``top`` not an integer tensor or a ``(values, indices)`` result, its
            values not a dense floating-point tensor; ``test`` not a :class:`Ratings`;
            ``k`` not an int, ``threshold`` not a real number or None, ``recall`` not a
            str; ``users`` not an integer tensor or a sequence of ints (a bool or uint8
            tensor too: neither is read as a mask).
        ValueError: ``top`` not 2-D, with fewer rows than the test users need, an item
            index at or above ``test.n_items`` or twice in a row, on the meta device, or
            values of another shape or device; ``k`` below 1; ``recall`` neither ``"n"``
            nor ``"min"``; ``threshold`` not finite; ``test`` empty, rating a (user, item)
            pair twice, or with no rating reaching ``threshold``; ``users`` not 1-D, on
            the meta device, of another length than ``top``'s rows, a user out of range
            or twice in it, or lacking a test user with a relevant rating.

    Example::

        >>> from nnsparse.data import Ratings, ranking_metrics
        >>> test = Ratings.from_triples([0, 0, 1], [0, 1, 2], [5., 3., 4.])  # ids = indices here
        >>> scores = torch.tensor([[0.1, 0.9, 0.8], [0.7, 0.1, 0.3]])  # (users, items)
        >>> lists = scores.topk(2, dim=1)                 # user 0: [1, 2], user 1: [0, 2]
        >>> figures = ranking_metrics(lists, test)
        >>> {key: round(value, 4) for key, value in figures.items()}
        {'precision@2': 0.5, 'recall@2': 0.75, 'ndcg@2': 0.622, 'hit_rate@2': 1.0, 'users': 2}
        >>> ranking_metrics(lists, test, 1)["recall@1"]   # user 0: 1 hit / 2, user 1: 0 / 1
        0.25
        >>> ranking_metrics(lists, test, 1, recall="min")["recall@1"]  # user 0: 1 / min(1, 2)
        0.5
        >>> held = test.subset(test.user == 1)           # user 1's test ratings, its list only
        >>> ranking_metrics(lists.indices[1:], held, users=[1]) == ranking_metrics(lists, held)
        True
    """
    values: Optional[Tensor] = None
    if not isinstance(top, Tensor) and isinstance(getattr(top, "indices", None), Tensor) \
            and isinstance(getattr(top, "values", None), Tensor):
        values, top = top.values, top.indices
    if not isinstance(top, Tensor) or top.layout != torch.strided:
        got = (f"layout {top.layout}" if isinstance(top, Tensor)
               else type(top).__name__)
        raise TypeError(f"top must be a dense integer tensor of item indices (rows, k), or the "
                        f"(values, indices) result of torch.topk, nnsparse.stopk or "
                        f"Batchifier.topk, got {got}")
    if not int_dtype(top.dtype):
        raise TypeError(f"top must hold integer item indices, got dtype {top.dtype}; pass "
                        f"torch.topk's result (or its .indices), not the scores")
    if top.dim() != 2:
        raise ValueError(f"top must be 2-D (users, k), got shape {tuple(top.shape)}")
    refuse_meta(top, "top")
    if values is not None:
        if values.layout != torch.strided:
            raise TypeError(f"top's values must be a dense tensor, got layout {values.layout}")
        if not values.is_floating_point():
            raise TypeError(f"top's values must be floating point, got dtype {values.dtype}")
        if values.shape != top.shape:
            raise ValueError(f"top's values must have its indices' shape {tuple(top.shape)}, "
                             f"got {tuple(values.shape)}")
        if values.device != top.device:  # (top on the meta device is refused above)
            raise ValueError(f"top's values must be on its indices' device {top.device}, "
                             f"got {values.device}")
    _check_ratings(test, "test")
    k = top.shape[1] if k is None else as_count("k", k, 1, must="positive")
    if k < 1:
        raise ValueError("k must be positive, got top with 0 columns and no k")
    threshold = _checked_threshold(threshold)
    recall = as_choice(recall, "recall", ("n", "min"),
                       then=" (the denominator: n relevant items, or min(k, n))")
    user, item = _relevant(test, threshold)
    # a pair twice would count twice in n (recall's denominator, the ideal list), once in hits
    _check_unique_pairs("test", test)
    evaluated = torch.unique(user)  # sorted: the evaluated users
    if users is None:
        if top.shape[0] <= int(evaluated[-1]):
            raise ValueError(f"top must have a row for every test user (row u: user index u's "
                             f"list), so at least {int(evaluated[-1]) + 1} rows, got "
                             f"{top.shape[0]}; or pass users= (row j: user users[j]'s list)")
        at = evaluated
    else:
        at = _rows_of(users, top.shape[0], test.n_users, evaluated, test.user.device)
    at = at.to(top.device)  # the evaluated users' rows only cross to the CPU
    users = evaluated
    top = top[at, :k].cpu().long()
    placed = top >= 0
    if values is not None:
        placed &= values[at, :k].detach().cpu() > -torch.inf  # -inf and NaN: no item
    n_items = test.n_items
    if bool((top >= n_items).any()):
        raise ValueError(f"top's item indices must be below test.n_items {n_items} "
                         f"(negative for an empty place), got {int(top.max())}")
    ordered = torch.where(placed, top, -1 - torch.arange(top.shape[1])).sort(1).values
    twice = ordered[:, 1:] == ordered[:, :-1]
    if bool(twice.any()):
        row = int(twice.any(1).nonzero()[0])
        raise ValueError(f"top must list an item once a row: user {int(users[row])}'s list "
                         f"holds item {int(ordered[row, 1:][twice[row]][0])} twice")
    return _figures(top, placed, users, user, item, n_items, k, recall)
