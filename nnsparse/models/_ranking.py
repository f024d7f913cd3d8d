"""Top-k ranking evaluation of a fitted model: :meth:`RatingModel.evaluate_ranking`'s work.

The scores of a user are :meth:`RatingModel.predict_entries`'s predictions for every
item, computed from the model's dense output rows, ``batch_size`` matrix rows at a
time: a user-oriented model's rows are users (each chunk gives ``batch_size x
items`` scores, ranked at once); an item-oriented model's rows are items (each chunk
gives the ``batch_size`` items' scores for every evaluated user, merged into a running
top-k per user).  The ``users x items`` matrix is never held.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor

from .._index import csr_indices
from ..data import SparseRowDataset
from ..data.ranking import _figures

if TYPE_CHECKING:  # (base imports this module: no cycle at run time)
    from .base import RatingModel

__all__: list[str] = []

#: the score of an item that is no recommendation (a training item left out)
_OUT = -math.inf


def _top_k(values: Tensor, index: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """The ``min(k, columns)`` best ``(value, index)`` pairs of each row, best first:
    by value descending, ties by the smaller index (the indices of a row are distinct).

    Deterministic whatever ``torch.topk`` does with ties: the ``k``-th value ``v`` of
    each row is read, the entries above ``v`` are all taken, and the entries equal to
    ``v`` with the smallest indices fill the remaining places."""
    rows, columns = values.shape
    if columns > k:
        kth = values.topk(k, dim=1).values[:, -1:]
        take = values >= kth
        tied = (take.sum(1) > k).nonzero().squeeze(1)  # rows with more than k candidates
        if tied.numel():
            v, i = values[tied], index[tied]
            above, equal = v > kth[tied], v == kth[tied]
            need = k - above.sum(1, keepdim=True)  # >= 1: the k-th entry is not above itself
            key = torch.where(equal, i, torch.iinfo(torch.int64).max)
            cut = key.topk(k, dim=1, largest=False).values.gather(1, need - 1)
            take[tied] = above | (equal & (i <= cut))  # exactly k a row
        values, index = values[take].view(rows, k), index[take].view(rows, k)
    order = index.argsort(dim=1)
    values, index = values.gather(1, order), index.gather(1, order)
    order = values.argsort(dim=1, descending=True, stable=True)  # ties keep index order
    return values.gather(1, order), index.gather(1, order)


class _Scorer:
    """The pieces of :meth:`RatingModel.predict_entries` for whole rows of scores."""

    def __init__(self, model: "RatingModel", n_items: int, device: torch.device) -> None:
        self.model, self.device, self.n_items = model, device, n_items
        self.n_users_fit = int(model.user_count.shape[0])
        self.n_items_fit = int(model.item_count.shape[0])
        self.global_mean = float(model.global_mean)
        known = torch.zeros(n_items, dtype=torch.bool)
        known[:self.n_items_fit] = model.item_count > 0
        self.item_known = known
        # an unknown user's score of each item: the item mean, or the global mean
        fallback = torch.full((n_items,), self.global_mean, dtype=torch.float32)
        fallback[:self.n_items_fit] = torch.where(
            known[:self.n_items_fit], model.item_mean.float(), fallback[:self.n_items_fit])
        self.item_fallback = fallback.to(device)
        self.dtype = next(model.parameters()).dtype
        self.dataset = SparseRowDataset(model._input)

    def user_known(self, users: Tensor) -> Tensor:
        """Which users (CPU indices) have training ratings (the network predicts them)."""
        count = self.model.user_count
        inside = users < self.n_users_fit
        return inside & (count[users.clamp(max=self.n_users_fit - 1)] > 0)

    def user_fallback(self, users: Tensor, known: Tensor) -> Tensor:
        """A user's score of the items without training ratings: the user mean (known
        user) or the global mean (unknown user); float32 ``(users,)`` on the device."""
        mean = self.model.user_mean.float()[users.clamp(max=self.n_users_fit - 1)]
        return torch.where(known, mean, self.global_mean).to(self.device)

    def rows(self, rows: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The dense predictions (float32, rating scale, on the device) of the matrix rows
        ``rows`` for every column of the fitted width, and the ``(row position, column)``
        of their training entries (CPU)."""
        batch = self.dataset.collate([self.dataset[int(i)] for i in rows])
        crow, col = csr_indices(batch.input)
        at = torch.repeat_interleave(torch.arange(rows.shape[0]), crow.diff())
        batch = batch.to(self.device)
        x = batch.input if batch.input.dtype == self.dtype else batch.input.to(self.dtype)
        out = self.model(x, batch.row_index)
        out = self.model._norm.denormalize(out, batch.row_index[:, None]).to(torch.float32)
        # (a NaN prediction, which no fitted model should give, ranks as no recommendation:
        # it would compare with nothing, and a list would lose its place)
        return torch.where(out.isnan(), _OUT, out), at, col


def _chunks(index: Tensor, size: int) -> Iterator[Tensor]:
    for start in range(0, index.shape[0], size):
        yield index[start:start + size]


def _top_user_rows(scorer: _Scorer, users: Tensor, k: int, exclude: bool, size: int,
                   bar: Any) -> Tuple[Tensor, Tensor]:
    """A user-oriented model: each chunk of users' full rows of scores, ranked at once."""
    n_items, fit, device = scorer.n_items, scorer.n_items_fit, scorer.device
    known_items = scorer.item_known[:fit].to(device)
    top_v, top_i = [], []
    for chunk in _chunks(users, size):
        known = scorer.user_known(chunk)
        fallback = scorer.user_fallback(chunk, known)
        scores = scorer.item_fallback.expand(chunk.shape[0], n_items).clone()
        if bool(known.any()):
            where = known.nonzero().squeeze(1)
            out, at, col = scorer.rows(chunk[where])
            mean = fallback[where.to(device)][:, None]
            part = torch.cat([torch.where(known_items, out, mean),
                              mean.expand(-1, n_items - fit)], dim=1)
            if exclude:
                part[at.to(device), col.to(device)] = _OUT
            scores[where.to(device)] = part
        index = torch.arange(n_items, device=device).expand(chunk.shape[0], n_items)
        v, i = _top_k(scores, index, k)
        top_v.append(v)
        top_i.append(i)
        bar.update(1)
    return torch.cat(top_v), torch.cat(top_i)


def _top_item_rows(scorer: _Scorer, users: Tensor, k: int, exclude: bool, size: int,
                   bar: Any) -> Tuple[Tensor, Tensor]:
    """An item-oriented model: each chunk of items' scores for every evaluated user,
    merged into a running top-k per user."""
    device, n = scorer.device, users.shape[0]
    known = scorer.user_known(users)
    at_known = known.nonzero().squeeze(1).to(device)
    columns = users[known].to(device)
    # the evaluated user of each user index (-1: not evaluated), for the training entries
    position = torch.full((max(scorer.n_users_fit, int(users.max()) + 1),), -1,
                          dtype=torch.int64)
    position[users] = torch.arange(n)
    # items without training ratings: one score per user (user or global mean), so the
    # first k of them (ties go to the smaller index) are all that can enter a top k
    unknown = (~scorer.item_known).nonzero().squeeze(1)[:k].to(device)
    top_v = scorer.user_fallback(users, known)[:, None].expand(n, unknown.shape[0])
    top_i = unknown.expand(n, unknown.shape[0])
    top_v, top_i = _top_k(top_v.contiguous(), top_i.contiguous(), k)
    for chunk in _chunks(scorer.item_known.nonzero().squeeze(1), size):
        out, at, col = scorer.rows(chunk)
        block = scorer.item_fallback[chunk.to(device)].expand(n, chunk.shape[0]).clone()
        block[at_known] = out[:, columns].T
        if exclude:
            who = position[col]
            keep = who >= 0
            block[who[keep].to(device), at[keep].to(device)] = _OUT
        index = chunk.to(device).expand(n, chunk.shape[0])
        top_v, top_i = _top_k(torch.cat([top_v, block], 1), torch.cat([top_i, index], 1), k)
        bar.update(1)
    return top_v, top_i


def evaluate_ranking(model: "RatingModel", user: Tensor, item: Tensor, n_test_items: int,
                     k: int, exclude_train: bool, batch_size: int,
                     show: bool) -> Dict[str, Any]:
    """:meth:`RatingModel.evaluate_ranking` on checked arguments: ``(user, item)`` the
    relevant test pairs (CPU int64, :func:`~nnsparse.data.ranking._relevant`'s), their
    ratings' ``n_items`` ``n_test_items``."""
    from tqdm import tqdm

    users = torch.unique(user)  # sorted: the evaluated users
    n_items = max(n_test_items, int(model.item_count.shape[0]))
    top = min(k, n_items)
    device = model.device
    scorer = _Scorer(model, n_items, device)
    item_rows = model._norm.orientation == "item"
    rows = (int(scorer.item_known.sum()) if item_rows else users.shape[0])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), tqdm(total=-(-rows // batch_size), desc="ranking",
                                   unit="batch", leave=False, disable=not show) as bar:
            run = _top_item_rows if item_rows else _top_user_rows
            top_v, top_i = run(scorer, users, top, exclude_train, batch_size, bar)
    finally:
        model.train(was_training)
    return _figures(top_i.cpu(), top_v.cpu() > _OUT, users, user, item, n_items, k)
