"""Test RMSE of the main example's model trained in float32 and under bf16 autocast.

The training of ``examples/movielens_autoencoder.py`` (synthetic default:
``nnsparse.data.synthetic_ratings``, item autoencoder, hidden 500, batch 32,
Adam lr 3e-4 / weight decay 1e-3, ``SDAESparseCriterion(MSELoss)`` with
alpha 1, beta 0.5, hide ratio 0.25, the best validation epoch kept),
repeated here with an autocast switch (the example itself has no flag): each
run trains the same seeded model in float32 and with
``torch.autocast(device, dtype=torch.bfloat16)`` around the forward pass and
the loss, and prints both test RMSEs and their difference.  The target of the
issue: within 0.005.

``--modes`` picks the encoder's kernels: ``auto`` (the example's: sparse
kernels at this density, which autocast leaves in float32) and ``dense``
(a densified batch and a GEMM, which autocast runs in bfloat16).

Run:  python benchmarks/bench_amp.py                     # 40 epochs, 1 thread
      python benchmarks/bench_amp.py --epochs 2 --modes auto   # a quick check
      python benchmarks/bench_amp.py --device cuda --dtype float16   # + GradScaler
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import nnsparse  # noqa: E402
from nnsparse.data import (RatingErrors, RatingNormalizer, SparseRowDataset,  # noqa: E402
                           random_split, synthetic_ratings)


class Autoencoder(nn.Module):
    """The main example's model."""

    def __init__(self, width: int, hidden: int, mode: str) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden, mode=mode)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x, pattern=None):
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


def evaluate(model, norm, inputs, target, device, amp) -> float:
    data = SparseRowDataset(inputs, target)
    errors = RatingErrors()
    model.eval()
    with torch.no_grad(), amp():
        for batch in DataLoader(data, batch_size=256, collate_fn=data.collate):
            (x, y), rows = batch, batch.row_index
            x, y = x.to(device), y.to(device)
            est = model(x, y).to_sparse_coo().coalesce()
            batch = y.to_sparse_coo().coalesce()
            pred = norm.denormalize(est.values().float(), rows.to(device)[batch.indices()[0]])
            errors.update(pred, batch.values())
    return errors.compute()["rmse"]


def train_and_test(args, mode: str, dtype) -> float:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    split = random_split(synthetic_ratings(seed=args.seed), test=0.1, validation=0.05,
                         seed=args.seed)
    norm = RatingNormalizer(split.train, orientation="item")
    x_train = norm.matrix(split.train)
    x_valid, x_test = norm.matrix(split.validation, False), norm.matrix(split.test, False)
    model = Autoencoder(norm.shape[1], args.hidden, mode).to(device)
    data = SparseRowDataset(x_train)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, collate_fn=data.collate,
                        generator=torch.Generator().manual_seed(args.seed))
    criterion = nnsparse.SDAESparseCriterion(
        nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
        generator=torch.Generator(device=device).manual_seed(args.seed))
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-3)
    scaler = torch.amp.GradScaler(args.device) if dtype == torch.float16 else None

    def amp():
        return torch.autocast(args.device, dtype=dtype or torch.bfloat16,
                              enabled=dtype is not None)

    best = (math.inf, None)
    from tqdm import tqdm
    for _ in tqdm(range(args.epochs), desc=f"{mode} {dtype}", disable=not args.progress,
                  leave=False):
        model.train()
        for x, _ in loader:
            x = x.to(device)
            with amp():
                loss = criterion(model(criterion.prepare_input(x), x), x)
            optimiser.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                optimiser.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimiser)
                scaler.update()
        norm.to(device)
        valid = evaluate(model, norm, x_train, x_valid, device, amp)
        norm.to("cpu")
        if valid < best[0]:  # the example keeps the best validation epoch
            best = (valid, {k: v.clone() for k, v in model.state_dict().items()})
    model.load_state_dict(best[1])
    norm.to(device)
    return evaluate(model, norm, x_train, x_test, device, amp)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   help="autocast dtype (float16: CUDA, with GradScaler)")
    p.add_argument("--modes", nargs="+", default=["auto", "dense"], choices=["auto", "dense"])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=500)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device on this machine")
    if args.dtype == "float16" and args.device == "cpu":
        p.error("--dtype float16 is for CUDA; CPU autocast uses bfloat16")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, "
          f"{args.epochs} epochs, autocast {args.dtype}")
    for mode in args.modes:
        start = time.perf_counter()
        full = train_and_test(args, mode, None)
        mid = time.perf_counter()
        low = train_and_test(args, mode, dtype)
        end = time.perf_counter()
        print(f"mode {mode:>5}: test RMSE float32 {full:.5f} ({mid - start:.0f} s), "
              f"autocast {args.dtype} {low:.5f} ({end - mid:.0f} s), "
              f"difference {low - full:+.5f}", flush=True)


if __name__ == "__main__":
    main()
