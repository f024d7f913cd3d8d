"""A pruned MLP: fixed-pattern sparse layers beside the dense model they came from.

Synthetic classification: inputs are Gaussian, labels are the argmax of a
random teacher MLP's outputs, split into training and test sets.  Three
students, the same widths:

* **dense**: ``nn.Linear -> ReLU -> nn.Linear``, trained;
* **pruned**: the trained dense model with each layer pruned by magnitude to
  ``--density`` (``SparseWeightLinear.from_dense``), then fine-tuned: the
  pattern stays fixed, only the kept values (and the biases) learn;
* **sparse from scratch**: ``SparseWeightLinear.random`` layers of the same
  density, trained from their ``nn.Linear``-like initialisation.

It prints each model's test accuracy and weight count.

    python examples/pruned_mlp.py                    # the run in docs/sparse_mm.md
    python examples/pruned_mlp.py --epochs 2 --samples 2000 --no-progress
"""
from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn
from tqdm import tqdm

from nnsparse import SparseWeightLinear


def make_data(samples: int, width: int, hidden: int, classes: int, seed: int
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``(samples, width)`` and the labels a random teacher MLP gives them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, width, generator=g)
    w1 = torch.randn(width, hidden, generator=g) / width ** 0.5
    w2 = torch.randn(hidden, classes, generator=g) / hidden ** 0.5
    return x, (torch.relu(x @ w1) @ w2).argmax(1)


def dense_mlp(width: int, hidden: int, classes: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def pruned(model: nn.Sequential, density: float) -> nn.Sequential:
    """Each ``nn.Linear`` of ``model`` pruned by magnitude into a ``SparseWeightLinear``."""
    return nn.Sequential(*(SparseWeightLinear.from_dense(m, density) if isinstance(m, nn.Linear)
                           else m for m in model))


def sparse_mlp(width: int, hidden: int, classes: int, density: float, seed: int) -> nn.Sequential:
    return nn.Sequential(SparseWeightLinear.random(width, hidden, density, seed=seed), nn.ReLU(),
                         SparseWeightLinear.random(hidden, classes, density, seed=seed + 1))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch_size: int,
          lr: float, progress: bool, desc: str) -> None:
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in tqdm(range(epochs), desc=desc, disable=not progress, leave=False):
        for batch in torch.randperm(x.shape[0], generator=g).split(batch_size):
            loss = loss_fn(model(x[batch]), y[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def weights(model: nn.Module) -> int:
    """The number of weights (values of a sparse layer, entries of a dense one), no biases."""
    return sum(m.nnz if isinstance(m, SparseWeightLinear) else m.weight.numel()
               for m in model if isinstance(m, (nn.Linear, SparseWeightLinear)))


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20000, help="training + test samples")
    p.add_argument("--width", type=int, default=256, help="input features")
    p.add_argument("--hidden", type=int, default=1024, help="hidden units of every student")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--density", type=float, default=0.1, help="share of weights kept")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--finetune-epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    x, y = make_data(args.samples, args.width, 64, args.classes, args.seed)
    n_train = int(0.8 * args.samples)
    (x_tr, y_tr), (x_te, y_te) = (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
    fit = dict(batch_size=args.batch_size, lr=args.lr, progress=not args.no_progress)

    dense = dense_mlp(args.width, args.hidden, args.classes)
    train(dense, x_tr, y_tr, args.epochs, desc="dense", **fit)
    prune = pruned(dense, args.density)
    result = {"dense": accuracy(dense, x_te, y_te), "pruned": accuracy(prune, x_te, y_te)}
    train(prune, x_tr, y_tr, args.finetune_epochs, desc="fine-tune", **fit)
    result["pruned+fine-tuned"] = accuracy(prune, x_te, y_te)
    scratch = sparse_mlp(args.width, args.hidden, args.classes, args.density, args.seed)
    train(scratch, x_tr, y_tr, args.epochs, desc="sparse", **fit)
    result["sparse from scratch"] = accuracy(scratch, x_te, y_te)

    counts = {"dense": weights(dense), "pruned": weights(prune),
              "pruned+fine-tuned": weights(prune), "sparse from scratch": weights(scratch)}
    print(f"test accuracy ({args.samples - n_train} samples, {args.classes} classes, "
          f"density {args.density:g}):")
    for name, acc in result.items():
        print(f"  {name:20s} {acc:.3f}   ({counts[name]:,} weights)")
    return result


if __name__ == "__main__":
    main()
