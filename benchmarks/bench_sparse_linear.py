"""Forward+backward time of SparseLinearBatch beside the ways PyTorch users do it today.

For each shape (rows, in, out, density) one batch of random sparse rows is
built and each method runs a training step on it: ``y = x @ W.T (+ b)``, then
``y.backward(g)``, gradients set to None in between.  The table prints the
median milliseconds per step and each peer's time as a multiple of
SparseLinearBatch's (dense weight gradient, ``--mode``, auto by default), all measured in the same run, so
the ratios hold on a shared, noisy machine.

    python benchmarks/bench_sparse_linear.py              # the three issue shapes
    python benchmarks/bench_sparse_linear.py --quick      # the smallest only
    python benchmarks/bench_sparse_linear.py --crossover  # sparse vs dense kernels by density

Peers: ``nn.Linear`` on the batch densified beforehand (densification not
timed), ``torch.sparse.mm`` with COO and with CSR input, ``F.embedding_bag``
with ``per_sample_weights`` and dense or sparse gradients, and
``torchsparsegradutils.sparse_mm`` when it is installed.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import nnsparse

warnings.filterwarnings("ignore", message=".*Sparse (CSR|invariant).*")

SHAPES = [(128, 6040, 512, 0.027), (128, 69878, 512, 0.005), (128, 480189, 512, 0.0004)]


DEVICE = torch.device("cpu")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _batch(rows: int, width: int, density: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    nnz = int(rows * width * density)
    key = torch.unique(torch.randint(0, rows * width, (nnz,), generator=g))
    row, col = key // width, key % width
    values = torch.randn(key.shape[0], generator=g)
    return row.to(DEVICE), col.to(DEVICE), values.to(DEVICE)


def _time(step: Callable[[], None], repeat: int, budget: float) -> float:
    """Median seconds of ``step`` over ``repeat`` runs (fewer when over ``budget`` s)."""
    step()  # warm-up: allocator, thread pool, lazy init
    _sync()
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < repeat and (len(times) < 2 or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _methods(rows: int, width: int, out: int, density: float, dense_peers: bool, mode: str):
    """name -> a training step on one batch of this shape."""
    row, col, values = _batch(rows, width, density)
    coo = torch.sparse_coo_tensor(torch.stack([row, col]), values, (rows, width)).coalesce()
    csr = coo.to_sparse_csr()
    grad = torch.randn(rows, out, device=DEVICE)
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(width, out, mode=mode).to(DEVICE)
    layer_sg = nnsparse.SparseLinearBatch(width, out, sparse_grad=True).to(DEVICE)
    weight = torch.nn.Parameter(layer.weight.detach().contiguous())  # nn.Linear's layout
    table = torch.nn.Parameter(layer.weight.detach().t().contiguous())  # (in, out)
    offsets = csr.crow_indices()[:-1]
    index = csr.col_indices()

    def step(fn: Callable[[], torch.Tensor], *params: torch.nn.Parameter):
        def run() -> None:
            for p in params:
                p.grad = None
            fn().backward(grad)
        run.params = params  # so the table can free the last step's gradients
        return run

    methods: Dict[str, Optional[Callable[[], None]]] = {
        f"SparseLinearBatch ({mode})": step(lambda: layer(csr), *layer.parameters()),
        "SparseLinearBatch sparse_grad": step(lambda: layer_sg(csr), *layer_sg.parameters()),
    }
    if dense_peers:
        dense = csr.to_dense()
        methods["nn.Linear (densified)"] = step(lambda: F.linear(dense, weight), weight)
    else:
        methods["nn.Linear (densified)"] = None
    methods["torch.sparse.mm COO"] = step(lambda: torch.sparse.mm(coo, weight.t()), weight)
    methods["torch.sparse.mm CSR"] = step(lambda: torch.sparse.mm(csr, weight.t()), weight)
    methods["embedding_bag"] = step(lambda: F.embedding_bag(
        index, table, offsets, mode="sum", per_sample_weights=csr.values()), table)
    methods["embedding_bag sparse"] = step(lambda: F.embedding_bag(
        index, table, offsets, mode="sum", per_sample_weights=csr.values(), sparse=True), table)
    try:
        from torchsparsegradutils import sparse_mm
    except ImportError:
        methods["torchsparsegradutils"] = None
    else:
        methods["torchsparsegradutils"] = step(lambda: sparse_mm(coo, weight.t()), weight)
    return methods


def _table(args: argparse.Namespace) -> None:
    shapes = SHAPES[:1] if args.quick else SHAPES
    where = (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda"
             else f"{torch.get_num_threads()} CPU threads")
    print(f"torch {torch.__version__}, {where}; "
          "ms per forward+backward step (x = time / SparseLinearBatch's)")
    for rows, width, out, density in shapes:
        print(f"\nshape (rows={rows}, in={width}, out={out}, density={density:.2%})")
        dense_peers = rows * width * out <= args.max_dense
        base = None
        methods = _methods(rows, width, out, density, dense_peers, args.mode)
        for name, run in methods.items():
            if run is None:
                print(f"  {name:32s}      skipped (not installed / over --max-dense)")
                continue
            ms = 1e3 * _time(run, args.repeat, args.budget)
            for p in run.params:  # free this method's gradients before the next one runs
                p.grad = None
            base = base or ms
            print(f"  {name:32s} {ms:9.2f} ms   {ms / base:7.2f}x")


def _crossover(args: argparse.Namespace) -> None:
    """Sparse vs dense kernels of SparseLinearBatch by density: where auto switches."""
    rows, width, out = 128, 6040, 512
    print(f"crossover at (rows={rows}, in={width}, out={out}): ms per step, "
          "dense/sparse > 1 means the sparse kernels win")
    for density in (0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5):
        row, col, values = _batch(rows, width, density)
        x = torch.sparse_coo_tensor(torch.stack([row, col]), values, (rows, width)).to_sparse_csr()
        grad = torch.randn(rows, out, device=DEVICE)
        times = {}
        for mode in ("sparse", "dense"):
            layer = nnsparse.SparseLinearBatch(width, out, mode=mode).to(DEVICE)

            def run() -> None:
                layer.zero_grad(set_to_none=True)
                layer(x).backward(grad)
            times[mode] = 1e3 * _time(run, args.repeat, args.budget)
        print(f"  density {density:6.1%}: sparse {times['sparse']:8.2f} ms, dense "
              f"{times['dense']:8.2f} ms, dense/sparse {times['dense'] / times['sparse']:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the smallest shape only")
    parser.add_argument("--crossover", action="store_true",
                        help="time the sparse and dense kernels over densities")
    parser.add_argument("--repeat", type=int, default=20, help="timed steps per method")
    parser.add_argument("--budget", type=float, default=5.0,
                        help="seconds per method before fewer repeats are taken")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--mode", default="auto", choices=["auto", "sparse", "dense"],
                        help="SparseLinearBatch's kernel choice in the table")
    parser.add_argument("--max-dense", type=float, default=4e10,
                        help="skip nn.Linear above this rows*in*out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    (_crossover if args.crossover else _table)(args)


if __name__ == "__main__":
    main()
