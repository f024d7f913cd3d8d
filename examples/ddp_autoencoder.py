"""The main example's autoencoder trained data-parallel with torchrun and DDP.

    torchrun --nproc_per_node=2 examples/ddp_autoencoder.py            # CPU, gloo
    torchrun --nproc_per_node=2 examples/ddp_autoencoder.py --sparse-grad
    torchrun --nproc_per_node=4 examples/ddp_autoencoder.py --device cuda   # NCCL
    python examples/ddp_autoencoder.py                                  # one process

The model, data and criterion are those of ``examples/movielens_autoencoder.py``
(``SparseLinearBatch -> tanh -> SparseOutputLinear -> tanh``,
``SDAESparseCriterion(MSELoss)`` on the synthetic ratings).  ``--batch-size``
is the global batch: each of the N processes reads ``batch_size / N`` rows a
step, through a ``DistributedSampler`` shuffled with the same seed, so one
step of N processes sees the rows one process sees.  Rank 0 alone evaluates,
keeps the best epoch, prints and saves; the last line is ``test RMSE: <value>``.
See ``docs/distributed.md``.
"""
import argparse
import math
import os
import time
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

import nnsparse
from nnsparse import distributed as nd
from nnsparse.data import (RatingErrors, RatingNormalizer, SparseRowDataset, random_split,
                           synthetic_ratings)


class Autoencoder(nn.Module):
    """``tanh(decoder(tanh(encoder(x))))``, the decoder sampled at ``pattern`` when given."""

    def __init__(self, width: int, hidden: int, sparse_grad: bool = False) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden, sparse_grad=sparse_grad)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width, sparse_grad=sparse_grad)

    def forward(self, x: Any, pattern: Any = None) -> Any:
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


def _positive(kind: type):
    def parse(text: str):
        value = kind(text)
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        if value == math.inf:
            raise argparse.ArgumentTypeError(f"must be finite, got {text}")
        if kind is int and value >= 2 ** 63:  # the counts torch and nnsparse take are int64
            raise argparse.ArgumentTypeError(f"must be below 2**63 (int64), got {text}")
        return value
    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hidden", type=_positive(int), default=500)
    p.add_argument("--epochs", type=_positive(int), default=40)
    p.add_argument("--batch-size", type=_positive(int), default=32,
                   help="global batch, split evenly over the processes")
    p.add_argument("--lr", type=_positive(float), default=3e-4)
    p.add_argument("--weight-decay", type=float, default=1e-3)
    p.add_argument("--alpha", type=float, default=1.0, help="weight of hidden ratings")
    p.add_argument("--beta", type=float, default=0.5, help="weight of the other ratings")
    p.add_argument("--hide-ratio", type=float, default=0.25)
    p.add_argument("--sparse-grad", action="store_true",
                   help="sparse weight gradients (LazyAdam on them, Adam on the rest)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=_positive(int), default=1,
                   help="torch threads per process (processes x threads <= cores)")
    p.add_argument("--save", help="rank 0 saves the trained state_dict here")
    p.add_argument("--no-progress", action="store_true",
                   help="no tqdm bars (they are off anyway when stderr is not a terminal)")
    args = p.parse_args(argv)
    if not 0 <= args.seed < 2 ** 64:  # torch.manual_seed's range ("Overflow when unpacking")
        p.error(f"--seed must be in [0, 2**64), got {args.seed}")
    # torch.set_num_threads(10**8) crashed the process; more threads than CPUs only
    # oversubscribe them, but torch runs them (1,024 on a 2-CPU machine)
    limit = max(1024, os.cpu_count() or 1)
    if args.threads > limit:
        p.error(f"--threads must be at most {limit}, got {args.threads}")
    if not 0 <= args.weight_decay < math.inf:
        p.error(f"--weight-decay must be non-negative and finite, got {args.weight_decay}")
    try:  # the criterion's own checks, before the data is made (they failed after it)
        nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=args.alpha, beta=args.beta,
                                     hide_ratio=args.hide_ratio)
    except (TypeError, ValueError) as error:
        p.error(f"--alpha, --beta, --hide-ratio: {error}")
    return args


def evaluate(model: nn.Module, norm: RatingNormalizer, inputs: torch.Tensor,
             target: torch.Tensor, device: torch.device) -> Dict[str, float]:
    """RMSE and MAE on the rating scale at ``target``'s entries, rows of ``inputs`` as input."""
    data = SparseRowDataset(inputs, target)
    errors = RatingErrors()
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(data, batch_size=256, collate_fn=data.collate):
            x, y = batch.input.to(device), batch.target.to(device)
            est = model(x, y).to_sparse_coo().coalesce()
            y = y.to_sparse_coo().coalesce()
            pred = norm.denormalize(est.values(), batch.row_index.to(device)[y.indices()[0]])
            errors.update(pred, y.values())
    return errors.compute()


def train(args: argparse.Namespace, model: nn.Module, norm: RatingNormalizer,
          x_train: torch.Tensor, x_valid: torch.Tensor, device: torch.device) -> None:
    """Train ``model`` (DDP-wrapped or not); rank 0 keeps the best epoch's weights."""
    world = nd.world_size()
    loader = nd.loader(SparseRowDataset(x_train), args.batch_size // world, seed=args.seed)
    # Each rank corrupts its own rows with its own stream.
    criterion = nnsparse.SDAESparseCriterion(
        nn.MSELoss(), alpha=args.alpha, beta=args.beta, hide_ratio=args.hide_ratio,
        generator=torch.Generator(device=device).manual_seed(args.seed + nd.rank()))
    optimiser = nnsparse.make_optimizer(nd.unwrap(model), lr=args.lr,
                                        weight_decay=args.weight_decay)
    best_rmse, best_state, best_epoch = math.inf, None, 0
    for epoch in range(1, args.epochs + 1):
        loader.sampler.set_epoch(epoch)
        model.train()
        start, loss_sum = time.perf_counter(), torch.zeros((), device=device)
        for batch in nd.progress(loader, disable=True if args.no_progress else None, leave=False,
                                 desc=f"epoch {epoch}/{args.epochs}"):
            x = batch.input.to(device)
            loss = criterion(model(criterion.prepare_input(x), x), x)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            loss_sum += loss.detach()
        if nd.is_main():  # the weights are the same on every rank
            valid = evaluate(nd.unwrap(model), norm, x_train, x_valid, device)
            print(f"epoch {epoch}: train loss {loss_sum.item() / len(loader):.4f} (rank 0), "
                  f"validation RMSE {valid['rmse']:.4f}, {time.perf_counter() - start:.1f} s")
            if valid["rmse"] < best_rmse:
                best_rmse, best_epoch = valid["rmse"], epoch
                best_state = {k: v.clone() for k, v in nd.unwrap(model).state_dict().items()}
    if best_state is not None:
        nd.unwrap(model).load_state_dict(best_state)
        print(f"kept epoch {best_epoch}, validation RMSE {best_rmse:.4f}")


def main(argv: Optional[List[str]] = None) -> Optional[Dict[str, float]]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = nd.init_from_env(device=args.device)
    try:
        world = nd.world_size()
        if args.batch_size % world:
            raise SystemExit(f"--batch-size must be a multiple of the {world} processes, "
                             f"got {args.batch_size}")
        # The same initial weights everywhere (DDP broadcasts rank 0's anyway).
        torch.manual_seed(args.seed)
        split = random_split(synthetic_ratings(seed=args.seed), test=0.1, validation=0.05,
                             seed=args.seed)
        norm = RatingNormalizer(split.train, orientation="item")
        x_train = norm.matrix(split.train)
        nd.main_print(f"{world} process(es) on {device}, global batch {args.batch_size} "
                      f"({args.batch_size // world} per process), sparse_grad={args.sparse_grad}")
        model = nd.wrap(Autoencoder(norm.shape[1], args.hidden, args.sparse_grad).to(device))
        start = time.perf_counter()
        train(args, model, norm, x_train, norm.matrix(split.validation, False), device)
        result = None
        if nd.is_main():
            norm.to(device)
            result = evaluate(nd.unwrap(model), norm, x_train, norm.matrix(split.test, False),
                              device)
            print(f"training took {time.perf_counter() - start:.1f} s")
            print(f"test RMSE: {result['rmse']:.4f}")
        if args.save:
            nd.save(nd.unwrap(model).state_dict(), args.save)
        return result
    finally:
        nd.cleanup()


if __name__ == "__main__":
    main()
