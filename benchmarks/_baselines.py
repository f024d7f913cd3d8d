"""Plain-torch reference models for bench_models.py: biased MF and a dense I-AutoRec.

Written the way a reader would write them in a notebook, so the nnsparse
models are compared with what the field runs, not with a straw man.
"""
from __future__ import annotations

import torch
from torch import nn

from nnsparse.data import Ratings


def biased_mf(train: Ratings, test: Ratings, rank: int = 50, epochs: int = 30,
              lr: float = 5e-3, reg: float = 0.1, batch: int = 1024, seed: int = 0) -> torch.Tensor:
    """``mu + b_u + b_i + p_u . q_i`` by Adam on mini-batches of ratings, L2 on the batch's rows.

    The Surprise-SVD objective (squared error + reg * (b_u^2 + b_i^2 + |p_u|^2 + |q_i|^2)
    per rating); returns the clipped predictions of ``test``.  The defaults
    (rank 50, reg 0.1, 30 epochs) were the best of the few tried on the
    synthetic sets (reg 0.05 over 40 epochs overfits, reg 0.3 learns only the biases).
    """
    g = torch.Generator().manual_seed(seed)
    nu, ni = train.n_users, train.n_items
    mu = float(train.rating.mean())
    p = nn.Parameter(torch.randn(nu, rank, generator=g) * 0.1)
    q = nn.Parameter(torch.randn(ni, rank, generator=g) * 0.1)
    bu, bi = nn.Parameter(torch.zeros(nu)), nn.Parameter(torch.zeros(ni))
    opt = torch.optim.Adam([p, q, bu, bi], lr=lr)
    u, i, r = train.user, train.item, train.rating
    for _ in range(epochs):
        for idx in torch.randperm(len(r), generator=g).split(batch):
            uu, ii = u[idx], i[idx]
            pred = mu + bu[uu] + bi[ii] + (p[uu] * q[ii]).sum(1)
            loss = ((pred - r[idx]) ** 2).sum() + reg * (
                bu[uu].square().sum() + bi[ii].square().sum()
                + p[uu].square().sum() + q[ii].square().sum())
            opt.zero_grad()
            (loss / len(idx)).backward()
            opt.step()
    with torch.no_grad():
        lo, hi = train.scale
        pred = mu + bu[test.user] + bi[test.item] + (p[test.user] * q[test.item]).sum(1)
        return pred.clamp(lo, hi)


def dense_autorec(train: Ratings, test: Ratings, hidden: int = 500, lam: float = 20.0,
                  epochs: int = 200, lr: float = 1e-3, batch: int = 256,
                  seed: int = 0) -> torch.Tensor:
    """The 30-line dense I-AutoRec: sigmoid hidden, identity output on raw ratings.

    Per batch: squared error summed over the observed entries + lam / 2 * (|V|^2 + |W|^2);
    Adam; the last epoch's model.  Unseen items or users get the training mean.
    """
    torch.manual_seed(seed)
    ni, nu = train.n_items, train.n_users
    r = torch.zeros(ni, nu)
    r[train.item, train.user] = train.rating
    mask = torch.zeros(ni, nu)
    mask[train.item, train.user] = 1.0
    enc, dec = nn.Linear(nu, hidden), nn.Linear(hidden, nu)
    opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(ni, generator=g).split(batch):
            out = dec(torch.sigmoid(enc(r[idx])))
            loss = (((out - r[idx]) * mask[idx]) ** 2).sum() + lam / 2 * (
                enc.weight.square().sum() + dec.weight.square().sum())
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        lo, hi = train.scale
        pred = dec(torch.sigmoid(enc(r)))[test.item, test.user].clamp(lo, hi)
        seen = (mask.sum(1)[test.item] > 0) & (mask.sum(0)[test.user] > 0)
        return torch.where(seen, pred, torch.full_like(pred, float(train.rating.mean())))
