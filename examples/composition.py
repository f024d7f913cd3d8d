"""nnsparse layers inside ordinary PyTorch models: compose, switch representation, save, load.

A classifier over sparse one-hot-heavy features: ``SparseLinearBatch`` reads
the sparse batch inside an ``nn.Sequential`` of ordinary modules.  A second
model switches representation mid-way: ``Densify`` turns the sparse input
dense for a plain ``nn.Linear``, then ``Sparsify`` keeps only the positive
ReLU activations as a sparse batch, which a ``SparseLinearBatch`` reads.  Both
are trained a few steps, saved with ``state_dict``, loaded into fresh copies
and checked to give the same outputs; the first one's sparse layer is also
loaded into a plain ``nn.Linear``.

    python examples/composition.py [--steps 200]
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Dict, List, Optional

import torch
from torch import nn
from tqdm import tqdm

import nnsparse


def make_data(rows: int, width: int, classes: int, seed: int = 0):
    """Sparse rows (a few active features each) and labels that depend on them."""
    g = torch.Generator().manual_seed(seed)
    active = torch.rand(rows, width, generator=g) < 8 / width
    values = torch.where(active, torch.rand(rows, width, generator=g) + 0.5, torch.zeros(()))
    teacher = torch.randn(width, classes, generator=g)
    labels = (values @ teacher).argmax(1)
    return nnsparse.sparsify(values), labels  # sparse COO (rows, width)


def models(width: int, classes: int) -> Dict[str, nn.Module]:
    return {
        "sparse-first": nn.Sequential(
            nnsparse.SparseLinearBatch(width, 64), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(64, classes)),
        "switching": nn.Sequential(
            nnsparse.Densify(width), nn.Linear(width, 64), nn.ReLU(),
            nnsparse.Sparsify(layout=torch.sparse_csr),  # keeps the positive activations
            nnsparse.SparseLinearBatch(64, classes)),
    }


def train(model: nn.Module, x, labels, steps: int, progress: bool) -> float:
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in tqdm(range(steps), disable=not progress, leave=False):
        loss = loss_fn(model(x), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(1) == labels).float().mean().item()


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--width", type=int, default=2000)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    x, labels = make_data(args.rows, args.width, args.classes)
    accuracy = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models(args.width, args.classes).items():
            accuracy[name] = train(model, x, labels, args.steps, not args.no_progress)
            print(f"{name}: training accuracy {accuracy[name]:.3f}")
            path = os.path.join(tmp, f"{name}.pt")
            torch.save(model.state_dict(), path)
            fresh = models(args.width, args.classes)[name].eval()
            fresh.load_state_dict(torch.load(path))
            with torch.no_grad():
                assert torch.allclose(fresh(x), model(x), atol=1e-6), name
            print(f"{name}: saved, loaded into a fresh model, same outputs")
    # The sparse layer's state_dict is nn.Linear's: run it on the densified batch.
    sparse_first = models(args.width, args.classes)["sparse-first"]
    dense_copy = nn.Linear(args.width, 64)
    dense_copy.load_state_dict(sparse_first[0].state_dict())
    with torch.no_grad():
        assert torch.allclose(dense_copy(nnsparse.densify(x)), sparse_first[0](x), atol=1e-5)
    print("SparseLinearBatch's state_dict loads into nn.Linear: same outputs on densify(x)")
    return accuracy


if __name__ == "__main__":
    main()
