"""Forward+backward time of nnsparse.sparse_mm and SparseWeightLinear beside their peers.

Part 1, ``sparse_mm(A, B)`` (A sparse with a pattern gradient, B dense with a
dense one) at (10,000 x 10,000, 0.1 %) @ (10,000 x 64) and at a batch of
8 x (2,000 x 2,000, 1 %) @ (2,000 x 32), A in COO and in CSR, against
``torchsparsegradutils.sparse_mm`` (which block-diagonalises a batch),
``torch.sparse.mm`` (2-D) / ``torch.bmm`` (batched COO), and, for the batch,
nnsparse on torchsparsegradutils' block-diagonal copy (the two batched
strategies on the same kernels).  Every peer's results (C, A's gradient at
the pattern, B's gradient) are checked against nnsparse's with ``allclose``.

Part 2, ``SparseWeightLinear`` at (in 4,096, out 4,096, 1 %, batch 256)
against ``nn.Linear`` with a masked dense weight and the seed-003 recipe (a
sparse COO weight rebuilt from a values parameter each step, then
``torch.sparse.mm``), with the memory of parameters and gradients.

Each table prints median milliseconds (forward, forward+backward) and each
peer's forward+backward time as a multiple of nnsparse's, all from the same
run, and a floor: the product's multiply-adds at the measured dense GEMM rate,
or its unavoidable bytes at the measured copy bandwidth, whichever is larger.

    python benchmarks/bench_sparse_mm.py --threads 1
    python benchmarks/bench_sparse_mm.py --device cuda
    python benchmarks/bench_sparse_mm.py --quick        # small shapes, seconds

torchsparsegradutils is an optional import (``pip install nnsparse[bench]``).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

import nnsparse
from nnsparse import SparseWeightLinear, sparse_mm

warnings.filterwarnings("ignore", message=".*Sparse (CSR|CSC|invariant).*")

try:
    import torchsparsegradutils as tsgu
    from torchsparsegradutils.utils import sparse_block_diag
except ImportError:  # a benchmark-only peer
    tsgu = None

DEVICE = torch.device("cpu")
DTYPE = torch.float32


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _median(step: Callable[[], None], repeat: int, budget: float) -> float:
    """Median milliseconds of ``step`` over ``repeat`` runs (fewer when over ``budget`` s)."""
    step()  # warm-up
    _sync()
    times: List[float] = []
    start = time.perf_counter()
    while len(times) < repeat and (len(times) < 3 or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


# -- machine rates for the floor -----------------------------------------------
def _rates(args: argparse.Namespace) -> Tuple[float, float]:
    """Measured dense GEMM multiply-add rate (per s) and copy bandwidth (bytes/s)."""
    n = 2048 if not args.quick else 512
    a, b = torch.randn(n, n, device=DEVICE, dtype=DTYPE), torch.randn(n, 256, device=DEVICE, dtype=DTYPE)
    gemm_s = _median(lambda: torch.mm(a, b), 5, 2.0) / 1e3
    big = torch.empty(1 << 25 if not args.quick else 1 << 22, device=DEVICE)  # float32
    dst = torch.empty_like(big)
    copy_s = _median(lambda: dst.copy_(big), 5, 2.0) / 1e3
    return n * n * 256 / gemm_s, 2 * big.numel() * 4 / copy_s


def _close(x: torch.Tensor, y: torch.Tensor) -> bool:
    """allclose at the dtype's precision, relative to the reference's scale."""
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-10}.get(DTYPE, 1e-4)
    x, y = x.double(), y.double()
    return bool(torch.allclose(x, y, rtol=tol, atol=tol * float(y.abs().max().clamp(min=1))))


def _floor_ms(macs: float, nbytes: float, rates: Tuple[float, float]) -> float:
    return 1e3 * max(macs / rates[0], nbytes / rates[1])


# -- part 1: sparse_mm ----------------------------------------------------------
def _random_pattern(nb: int, n: int, m: int, density: float, seed: int) -> torch.Tensor:
    """A coalesced COO ``(n, m)`` (``nb == 1``) or ``(nb, n, m)`` tensor, ``density`` filled,
    the same nnz in every matrix (as a batched CSR tensor needs)."""
    g = torch.Generator().manual_seed(seed)
    nnz = int(n * m * density)
    parts = []
    for k in range(nb):
        key = torch.randperm(n * m, generator=g)[:nnz]
        parts.append(torch.stack([torch.full_like(key, k), key // m, key % m]))
    index = torch.cat(parts, 1)
    values = torch.randn(index.shape[1], generator=g)
    if nb == 1:
        return torch.sparse_coo_tensor(index[1:], values, (n, m)).coalesce().to(DEVICE, DTYPE)
    return torch.sparse_coo_tensor(index, values, (nb, n, m)).coalesce().to(DEVICE, DTYPE)


def _to_csr(a: torch.Tensor) -> torch.Tensor:
    """CSR of a 2-D or batched COO tensor (torch converts 2-D only)."""
    if a.dim() == 2:
        return a.to_sparse_csr()
    parts = [a[k].coalesce().to_sparse_csr() for k in range(a.shape[0])]
    return torch.sparse_csr_tensor(torch.stack([p.crow_indices() for p in parts]),
                                   torch.stack([p.col_indices() for p in parts]),
                                   torch.stack([p.values() for p in parts]), a.shape)


def _grad_at_pattern(a: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A's gradient read at A's pattern, dense (for the allclose check only)."""
    return a.grad.to_dense() * mask


def _mm_methods(a: torch.Tensor, batched: bool) -> Dict[str, Optional[Callable]]:
    """name -> fn(A, B) giving C; None when unavailable."""
    methods: Dict[str, Optional[Callable]] = {"nnsparse.sparse_mm": sparse_mm}
    methods["torchsparsegradutils"] = tsgu.sparse_mm if tsgu is not None else None
    if not batched:
        methods["torch.sparse.mm"] = torch.sparse.mm
    elif a.layout == torch.sparse_coo:
        methods["torch.bmm"] = torch.bmm
    if batched and tsgu is not None and a.layout == torch.sparse_coo:
        # the other batched strategy on nnsparse's kernels: a block-diagonal copy
        def block_diag(a, b):
            return sparse_mm(sparse_block_diag(*a), b.reshape(-1, b.shape[-1])).view(
                b.shape[0], a.shape[1], b.shape[-1])
        methods["nnsparse on a block-diag copy"] = block_diag
    return methods


def _mm_table(title: str, a0: torch.Tensor, p: int, args, rates) -> None:
    batched = a0.dim() == 3
    b0 = torch.randn(*a0.shape[:-2], a0.shape[-1], p, device=DEVICE, dtype=DTYPE)
    nnz = a0._nnz()
    n_rows = a0.shape[-2] * (a0.shape[0] if batched else 1)
    macs = 3 * nnz * p  # C, A's gradient, B's gradient
    size = torch.finfo(DTYPE).bits // 8
    nbytes = size * (2 * b0.numel() + 2 * n_rows * p) + 3 * nnz * (size + 8 + 8)
    floor = _floor_ms(macs, nbytes, rates)
    mask = torch.sparse_coo_tensor(a0.indices(), torch.ones_like(a0.values()), a0.shape).to_dense()
    for layout in ("COO", "CSR"):
        a_base = a0 if layout == "COO" else _to_csr(a0)
        print(f"\n{title}, A {layout} (nnz {nnz:,}); floor {floor:.2f} ms")
        print(f"  {'method':34s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'x nnsparse':>11s}  allclose")
        reference = None
        base = None
        for name, fn in _mm_methods(a_base, batched).items():
            if fn is None:
                print(f"  {name:34s}   not installed (pip install torchsparsegradutils)")
                continue
            a = a_base.detach().clone().requires_grad_()
            b = b0.clone().requires_grad_()
            g = (torch.randn(*b0.shape[:-2], a0.shape[-2], p, device=DEVICE, dtype=DTYPE)
                 if reference is None else reference[3])

            def forward() -> torch.Tensor:
                with torch.no_grad():
                    return fn(a, b)

            def step() -> None:
                a.grad = b.grad = None
                fn(a, b).backward(g)
            try:
                c = fn(a, b)
                c.backward(g)
            except (RuntimeError, NotImplementedError) as e:
                print(f"  {name:34s}   fails: {str(e).splitlines()[0][:60]}")
                continue
            got = (c.detach(), _grad_at_pattern(a, mask), b.grad.clone(), g)
            layout = str(a.grad.layout).replace("torch.", "")
            if reference is None:
                reference, check = got, "reference"
            else:
                check = all(_close(x, y) for x, y in zip(got[:3], reference[:3]))
            check = f"{check} (A grad {layout})"
            fwd = _median(forward, args.repeat, args.budget)
            both = _median(step, args.repeat, args.budget)
            base = base or both
            print(f"  {name:34s} {fwd:9.2f} {both:11.2f} {both / base:10.2f}x  {check}")
            a.grad = b.grad = None


# -- part 2: the fixed-pattern layer ----------------------------------------------
def _layer_table(args, rates) -> None:
    n_in, n_out, density, rows = (4096, 4096, 0.01, 256) if not args.quick else (512, 512, 0.01, 64)
    torch.manual_seed(0)
    layer = SparseWeightLinear.random(n_in, n_out, density, seed=0, device=DEVICE, dtype=DTYPE)
    index = torch.stack([layer.row.long(), layer.col.long()])
    dense = torch.nn.Linear(n_in, n_out).to(DEVICE, DTYPE)
    mask = layer.weight.to_dense().detach() != 0
    with torch.no_grad():
        dense.weight.copy_(layer.weight.to_dense())
        dense.bias.copy_(layer.bias)
    values = torch.nn.Parameter(layer.values.detach().clone())
    bias = torch.nn.Parameter(layer.bias.detach().clone())

    def seed_recipe(x):
        w = torch.sparse_coo_tensor(index, values, (n_out, n_in))
        return torch.sparse.mm(w, x.t()).t() + bias

    pos = tuple(index)
    methods = {  # name -> (step's function, its parameters, its values' gradient)
        "SparseWeightLinear": (layer, list(layer.parameters()), lambda: layer.values.grad),
        "nn.Linear, masked dense weight": (lambda x: F.linear(x, dense.weight * mask, dense.bias),
                                           list(dense.parameters()),
                                           lambda: dense.weight.grad[pos]),
        "seed-003 recipe (COO + sparse.mm)": (seed_recipe, [values, bias], lambda: values.grad),
    }
    nnz = layer.nnz
    macs_fwd = nnz * rows
    print(f"\nSparseWeightLinear (in {n_in}, out {n_out}, density {density:.0%}, nnz {nnz:,}, "
          f"batch {rows})")
    for x_grad in (False, True):
        x0 = torch.randn(rows, n_in, device=DEVICE, dtype=DTYPE)
        g = torch.randn(rows, n_out, device=DEVICE, dtype=DTYPE)
        macs = macs_fwd * (3 if x_grad else 2)
        size = torch.finfo(DTYPE).bits // 8
        nbytes = size * (x0.numel() * 2 + g.numel() * 2) + nnz * (3 * size + 3 * 4)
        print(f" input gradient: {'yes' if x_grad else 'no'}; floor "
              f"{_floor_ms(macs, nbytes, rates):.2f} ms")
        print(f"  {'method':34s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'x nnsparse':>11s}  allclose")
        base = reference = None
        for name, (fn, params, values_grad) in methods.items():
            x = x0.clone().requires_grad_(x_grad)

            def forward() -> torch.Tensor:
                with torch.no_grad():
                    return fn(x)

            def step() -> None:
                for p in params:
                    p.grad = None
                x.grad = None
                fn(x).backward(g)
            try:
                step()
            except (RuntimeError, NotImplementedError) as e:
                print(f"  {name:34s}   fails: {str(e).splitlines()[0][:60]}")
                continue
            got = [fn(x).detach(), values_grad().clone(), params[-1].grad.clone()]
            got += [x.grad.clone()] if x_grad else []
            if reference is None:
                reference, check = got, "-"
            else:
                check = all(_close(u, v) for u, v in zip(got, reference))
            fwd = _median(forward, args.repeat, args.budget)
            both = _median(step, args.repeat, args.budget)
            base = base or both
            print(f"  {name:34s} {fwd:9.2f} {both:11.2f} {both / base:10.2f}x  {check}")
            for p in params:
                p.grad = None
    _memory(layer, dense)


def _memory(layer: SparseWeightLinear, dense: torch.nn.Linear) -> None:
    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)
    params = list(layer.parameters())
    ours = 2 * nbytes(params)  # parameters and their gradients
    pattern = nbytes(layer.buffers())
    theirs = 2 * nbytes(dense.parameters())
    print(f" memory: SparseWeightLinear parameters+gradients {ours / 2**20:.2f} MiB + pattern "
          f"{pattern / 2**20:.2f} MiB = {(ours + pattern) / 2**20:.2f} MiB; nn.Linear "
          f"{theirs / 2**20:.2f} MiB (+ the mask); ratio {(ours + pattern) / theirs:.2%}")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32",
                        choices=["float32", "float64", "float16", "bfloat16"],
                        help="of every operand (float16/bfloat16: CUDA)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--repeat", type=int, default=15, help="timed steps per method")
    parser.add_argument("--budget", type=float, default=5.0,
                        help="seconds per method before fewer repeats are taken")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--only", choices=["mm", "layer"], help="one part only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    global DEVICE, DTYPE
    DEVICE = torch.device(args.device)
    DTYPE = getattr(torch, args.dtype)
    where = (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda"
             else f"{torch.get_num_threads()} CPU thread(s)")
    rates = _rates(args)
    print(f"torch {torch.__version__}, nnsparse {nnsparse.__version__}, "
          f"torchsparsegradutils {_version('torchsparsegradutils')}, {where}, {args.dtype}; "
          f"measured GEMM {2 * rates[0] / 1e9:.0f} GFLOP/s, copy {rates[1] / 1e9:.1f} GB/s")
    if args.only in (None, "mm"):
        n, nb, bn = (10_000, 8, 2_000) if not args.quick else (1_000, 4, 200)
        _mm_table(f"({n:,} x {n:,}, 0.1%) @ ({n:,} x 64)", _random_pattern(1, n, n, 0.001, 0),
                  64, args, rates)
        _mm_table(f"{nb} x ({bn:,} x {bn:,}, 1%) @ ({bn:,} x 32)",
                  _random_pattern(nb, bn, bn, 0.01, 1), 32, args, rates)
    if args.only in (None, "layer"):
        _layer_table(args, rates)


if __name__ == "__main__":
    main()
