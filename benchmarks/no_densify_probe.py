"""No-hidden-densification probe: peak memory of every public entry point on huge, nearly empty inputs.

Each case builds its inputs (a batch of logical shape ``(8, 2**31)``,
``(2**20, 2**24)`` or ``(2**31, 8)`` with about 100 specified entries, or a layer whose own dense
weight fits), then runs the call (forward and, where it has one, backward).
The case runs in this process after resetting the kernel's peak-RSS mark
(``/proc/self/clear_refs``); the figure is ``VmHWM`` after the call minus
``VmRSS`` before it: the resident memory the call added at its peak.  An
address-space cap (``RLIMIT_AS``, current size + 1.5 GiB) turns a real
densification (gigabytes) into a quick ``RuntimeError`` instead of a swapped
machine: such a case reports ``ALLOC-FAIL``.  Each case runs once first on inputs
of its own (set up again after), so that the code pages of torch's kernels, read
in on their first use, are not counted as the call's memory.

Linux only.  Run:  ``OMP_NUM_THREADS=1 python benchmarks/no_densify_probe.py [name ...]``
(``--markdown`` prints the table rows of docs/no_densify_probe.md).
"""
import argparse
import gc
import os
import resource
import sys
import traceback
from typing import Callable, Dict, List, Tuple

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import nnsparse  # noqa: E402
from nnsparse import optim as nsoptim  # noqa: E402
from nnsparse.data import collate_sparse_rows, SparseRowDataset  # noqa: E402

BUDGET_MB = 200
NNZ = 100
WIDE = (8, 2**31)          # a few rows, a 2**31-wide vocabulary
TALL = (2**20, 2**24)      # a million rows, 16 M columns
ROWS = (2**31, 8)          # 2**31 rows (a transposed WIDE batch)
g = torch.Generator().manual_seed(0)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def coo(shape: Tuple[int, int], nnz: int = NNZ, grad: bool = False, coalesce: bool = True,
        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    row = torch.randint(0, shape[0], (nnz,), generator=g)
    col = torch.randint(0, shape[1], (nnz,), generator=g)
    values = torch.rand(nnz, generator=g, dtype=dtype) + 0.5
    x = torch.sparse_coo_tensor(torch.stack([row, col]), values, shape)
    x = x.coalesce() if coalesce else x
    return x.requires_grad_(grad) if grad else x


def csr(shape: Tuple[int, int], nnz: int = NNZ) -> torch.Tensor:
    return coo(shape, nnz).to_sparse_csr()


def _backward(out) -> None:
    if isinstance(out, torch.Tensor) and out.layout != torch.strided:
        out = out.coalesce().values() if out.layout == torch.sparse_coo else out.values()
    out.sum().backward()


CASES: Dict[str, Tuple[str, Callable[[], Callable[[], object]]]] = {}


def case(name: str, note: str = ""):
    def register(setup):
        CASES[name] = (note, setup)
        return setup
    return register


# ---------------------------------------------------------------- toolkit functions
@case("to_pairs(WIDE coo float64)", "float32 values refused past width 2**24 (indices inexact)")
def _():
    x = coo(WIDE, dtype=torch.float64)
    return lambda: nnsparse.to_pairs(x)


@case("from_pairs(100 pairs, size=2**31)")
def _():
    p = torch.stack([torch.randint(1, 2**31, (NNZ,)).double(), torch.rand(NNZ).double()], 1)
    return lambda: nnsparse.from_pairs(p, size=2**31)


@case("ssort(WIDE coo)")
def _():
    x = coo(WIDE)
    return lambda: nnsparse.ssort(x)


@case("ssort(TALL csr)")
def _():
    x = csr(TALL)
    return lambda: nnsparse.ssort(x)


@case("ssort_by_index(WIDE coo, descending)")
def _():
    x = coo(WIDE)
    return lambda: nnsparse.ssort_by_index(x, descending=True)


@case("stopk(WIDE coo, 3)")
def _():
    x = coo(WIDE)
    return lambda: nnsparse.stopk(x, 3)


@case("stopk(TALL coo, 3)", "output (rows, k) dense by design: 2**20 x 3 x (4+8) B = 36 MB")
def _():
    x = coo(TALL)
    return lambda: nnsparse.stopk(x, 3)


@case("sparsify(WIDE coo)")
def _():
    x = coo(WIDE)

    def run():
        try:
            return nnsparse.sparsify(x)
        except TypeError:
            return "TypeError (dense input only)"
    return run


@case("values_map(exp, WIDE coo) fwd+bwd")
def _():
    x = coo(WIDE, grad=True)
    return lambda: _backward(nnsparse.values_map(torch.exp, x))


@case("values_map(exp, TALL csr) fwd+bwd")
def _():
    x = csr(TALL).requires_grad_()
    return lambda: _backward(nnsparse.values_map(torch.exp, x))


@case("ValuesMap(sigmoid)(WIDE uncoalesced coo) fwd+bwd")
def _():
    x = coo(WIDE, grad=True, coalesce=False)
    m = nnsparse.ValuesMap(torch.sigmoid)
    return lambda: _backward(m(x))


@case("sparse_parts(TALL coo)")
def _():
    x = coo(TALL)
    return lambda: nnsparse.sparse_parts(x)


@case("DynamicSparseTensor 2-D, 100 appends, build(TALL)")
def _():
    rows = torch.randint(0, TALL[0], (NNZ,)).tolist()
    cols = torch.randint(0, TALL[1], (NNZ,)).tolist()

    def run():
        b = nnsparse.DynamicSparseTensor(ndim=2)
        for r, c in zip(rows, cols):
            b.append((r, c), 1.0)
        return b.build(TALL)
    return run


@case("DynamicSparseTensor 1-D, build(2**31) + build_pairs")
def _():
    idx = torch.randint(0, 2**31, (NNZ,)).tolist()

    def run():
        b = nnsparse.DynamicSparseTensor(dtype=torch.float64)  # pairs need exact indices
        for i in idx:
            b.append(i, 1.0)
        return b.build(2**31), b.build_pairs()
    return run


# ---------------------------------------------------------------- sparse_mm
@case("sparse_mm(TALL' (2**20, 4096) csr, dense (4096, 4)) fwd+bwd",
      "output (rows, 4) dense by design (16 MB); B's gradient is B-sized")
def _():
    a = csr((2**20, 4096)).requires_grad_()
    b = torch.rand(4096, 4, requires_grad=True)
    return lambda: _backward(nnsparse.sparse_mm(a, b))


@case("sparse_mm(dense (4, 2**20), (2**20, 4096) coo) fwd+bwd",
      "output (4, 4096) dense by design")
def _():
    a = torch.rand(4, 2**20, requires_grad=True)
    b = coo((2**20, 4096), grad=True)
    return lambda: _backward(nnsparse.sparse_mm(a, b))


@case("sparse_mm(WIDE coo, dense (2**31, 1))", "B is O(width) itself: not run at 2**31")
def _():
    return None


# ---------------------------------------------------------------- layers
@case("SparseLinearBatch(2**16, 4) on (2**20, 2**16) coo fwd+bwd",
      "weight 1 MB, output (rows, 4) dense by design (16 MB)")
def _():
    layer = nnsparse.SparseLinearBatch(2**16, 4)
    x = coo((2**20, 2**16))
    return lambda: _backward(layer(x))


@case("SparseLinearBatch(2**22, 4, sparse_grad) on (8, 2**22) csr fwd+bwd",
      "weight 64 MB (set up before the call)")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4, sparse_grad=True)
    x = csr((8, 2**22))
    return lambda: _backward(layer(x))


@case("SparseLinearBatch(2**22, 4) on (8, 2**22) csr fwd+bwd (dense weight grad)",
      "weight gradient is weight-sized (64 MB) by design")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4)
    x = csr((8, 2**22))
    return lambda: _backward(layer(x))


@case("sparse_linear(values-grad (8, 2**22) coo, weight (4, 2**22)) fwd+bwd",
      "input values get a gradient too")
def _():
    w = torch.rand(4, 2**22, requires_grad=True)
    x = coo((8, 2**22), grad=True)
    return lambda: _backward(nnsparse.sparse_linear(x, w))


@case("SparseOutputLinear(4, 2**22, sparse_grad) pattern (2**20, 2**22) fwd+bwd",
      "weight 64 MB; bias gradient O(out_features) like the weight")
def _():
    layer = nnsparse.SparseOutputLinear(4, 2**22, sparse_grad=True)
    h = torch.rand(2**20, 4, requires_grad=True)
    pattern = coo((2**20, 2**22))
    return lambda: _backward(layer(h, pattern))


@case("sampled_linear(h (8, 4), w (2**22, 4), pattern (8, 2**22)) fwd+bwd",
      "the large-weight sampled product over the used weight rows: O(nnz)")
def _():
    w = torch.rand(2**22, 4, requires_grad=True)
    h = torch.rand(8, 4, requires_grad=True)
    pattern = csr((8, 2**22))
    return lambda: _backward(nnsparse.sampled_linear(h, w, None, pattern, sparse_grad=True))


@case("SparseWeightLinear(pattern (4, 2**31), 100 nnz) on (8, 2**31) coo fwd+bwd")
def _():
    layer = nnsparse.SparseWeightLinear(coo((4, 2**31)))
    x = coo(WIDE)
    return lambda: _backward(layer(x))


@case("SparseWeightLinear(pattern (4, 2**31)) construction")
def _():
    p = coo((4, 2**31))
    return lambda: nnsparse.SparseWeightLinear(p)


@case("SparseWeightLinear(pattern (2**24, 2**20)) on dense (8, 2**20) fwd+bwd",
      "output (8, 2**24) dense by design (512 MB): not run")
def _():
    return None


@case("PatternSequential(ValuesMap, SparseWeightLinear (4, 2**31)) fwd+bwd")
def _():
    net = nnsparse.PatternSequential(nnsparse.ValuesMap(torch.tanh),
                                     nnsparse.SparseWeightLinear(coo((4, 2**31))))
    x = coo(WIDE)
    return lambda: _backward(net(x))


@case("Densify(2**31)", "dense by design: not run")
def _():
    return None


@case("Batchifier(SparseLinearBatch(2**16, 4)) over (2**20, 2**16) csr",
      "output (rows, 4) dense by design (16 MB)")
def _():
    net = nnsparse.SparseLinearBatch(2**16, 4)
    b = nnsparse.Batchifier(net, 4, batch_size=2**18, progress=False)
    x = csr((2**20, 2**16))
    return lambda: b(x)


# ---------------------------------------------------------------- criteria
@case("SparseCriterion(MSE)(sparse est WIDE, sparse target WIDE) fwd+bwd")
def _():
    crit = nnsparse.SparseCriterion(nn.MSELoss())
    t = coo(WIDE)
    est = torch.sparse_coo_tensor(t.indices(), torch.rand(NNZ), WIDE).coalesce().requires_grad_()
    return lambda: crit(est, t).backward()


@case("SparseCriterion(MSE, full_size_average)(sparse est TALL csr, target TALL) fwd+bwd")
def _():
    crit = nnsparse.SparseCriterion(nn.MSELoss(), full_size_average=True)
    t = csr(TALL)
    est = nnsparse.values_map(lambda v: v * 0.5, t).detach().requires_grad_()
    return lambda: crit(est, t).backward()


@case("SDAESparseCriterion prepare_input(WIDE) + fwd+bwd (sparse est)")
def _():
    crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, noise_ratio=0.3,
                                        hide_ratio=0.2, flip_ratio=0.1,
                                        generator=torch.Generator().manual_seed(0))
    t = coo(WIDE)
    est = torch.sparse_coo_tensor(t.indices(), torch.rand(NNZ), WIDE).coalesce().requires_grad_()

    def run():
        noisy = crit.prepare_input(t)
        crit(est, t).backward()
        return noisy
    return run


@case("SDAESparseCriterion.mask_alpha (WIDE)", "a dense (rows, n) bool by documentation: not run")
def _():
    return None


@case("SDAECriterion (dense data only)", "refuses a sparse input (TypeError): dense by design")
def _():
    return None


@case("prepare_input(SDAESparseCriterion, TALL coo)")
def _():
    crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), noise_ratio=0.5)
    t = coo(TALL)
    return lambda: nnsparse.prepare_input(crit, t)


@case("MaskCriterion prepare_input(WIDE) + fwd+bwd (sparse est)")
def _():
    crit = nnsparse.MaskCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                                  generator=torch.Generator().manual_seed(0))
    t = coo(WIDE)
    est = torch.sparse_coo_tensor(t.indices(), torch.rand(NNZ), WIDE).coalesce().requires_grad_()

    def run():
        crit.prepare_input(t)
        crit(est, t).backward()
    return run


@case("MaskCriterion prepare_input(TALL csr) + fwd+bwd (sparse est)")
def _():
    crit = nnsparse.MaskCriterion(nn.MSELoss(), hide_ratio=0.5)
    t = csr(TALL)

    def run():
        crit.prepare_input(t)
        est = nnsparse.values_map(lambda v: v * 0.5, t).detach().requires_grad_()
        crit(est, t).backward()
    return run


# ---------------------------------------------------------------- optimisers, clipping
def _fresh_step(layer: nn.Module, opt, width: int) -> Callable[[], object]:
    """A step on a new batch each call (a batch caches its structures: the second
    step on the same one builds nothing); the optimiser's state made by a first step
    before the measurement."""
    def run():
        layer(csr((8, width))).sum().backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
    run()
    return run


@case("LazyAdam fwd+bwd+step, SparseLinearBatch(2**22, 4, sparse_grad)",
      "state is 2 x weight (128 MB, made before the measured step)")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4, sparse_grad=True)
    return _fresh_step(layer, nsoptim.LazyAdam(layer.parameters()), 2**22)


@case("LazyAdam step, nn.Embedding(2**22, 4, sparse=True)")
def _():
    emb = nn.Embedding(2**22, 4, sparse=True)
    opt = nsoptim.LazyAdam(emb.parameters())

    def run():
        emb(torch.randint(0, 2**22, (NNZ,))).sum().backward()
        opt.step()
        opt.zero_grad()
    run()
    return run


@case("apply_optimizer_in_backward(adam) SparseLinearBatch(2**22, 4) fwd+bwd")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4)
    opt = nsoptim.apply_optimizer_in_backward(layer, "adam")

    def run():  # (zero_grad: a backward after another is refused as gradient accumulation)
        opt.zero_grad()
        layer(csr((8, 2**22))).sum().backward()
    run()
    return run


@case("apply_optimizer_in_backward(rowwise_adagrad) SparseOutputLinear(4, 2**22) fwd+bwd",
      "the bias's dense gradient, bias-sized (16 MB)")
def _():
    layer = nnsparse.SparseOutputLinear(4, 2**22)
    opt = nsoptim.apply_optimizer_in_backward(layer, "rowwise_adagrad")
    h = torch.rand(8, 4)

    def run():  # (zero_grad: a backward after another is refused as gradient accumulation)
        opt.zero_grad()
        layer(h, csr((8, 2**22))).values().sum().backward()
    run()
    return run


@case("fused_step_optimizer SparseLinearBatch(2**22, 4) fwd+bwd+step")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4, sparse_grad=True)
    return _fresh_step(layer, nsoptim.fused_step_optimizer(layer), 2**22)


@case("make_optimizer (SplitOptimizer) fwd+bwd+step, SparseLinearBatch(2**22, 4, sparse_grad)")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4, sparse_grad=True)
    return _fresh_step(layer, nnsparse.make_optimizer(layer), 2**22)


def _sparse_grad_model(width: int, out: int = 4) -> Tuple[nn.Module, torch.Tensor]:
    layer = nnsparse.SparseLinearBatch(width, out, sparse_grad=True)
    return layer, csr((8, width))


@case("clip_grad_norm_ on a sparse grad, SparseLinearBatch(2**22, 4)")
def _():
    layer, x = _sparse_grad_model(2**22)
    layer(x).sum().backward()
    return lambda: nsoptim.clip_grad_norm_(layer.parameters(), 0.1)


@case("clip_grad_value_ on a sparse grad, SparseLinearBatch(2**22, 4)")
def _():
    layer, x = _sparse_grad_model(2**22)
    layer(x).sum().backward()
    return lambda: nsoptim.clip_grad_value_(layer.parameters(), 0.1)


@case("clip_grad_norm_ on nn.Embedding(2**22, 4, sparse=True) grad")
def _():
    emb = nn.Embedding(2**22, 4, sparse=True)
    emb(torch.randint(0, 2**22, (NNZ,))).sum().backward()
    return lambda: nsoptim.clip_grad_norm_(emb.parameters(), 0.1)


# ---------------------------------------------------------------- data
@case("SparseRowDataset(TALL csr) + collate 64 rows")
def _():
    m = csr(TALL)

    def run():
        ds = SparseRowDataset(m)
        return ds.collate([ds[i] for i in range(64)])
    return run


@case("collate_sparse_rows(64 rows, width 2**31)")
def _():
    m = csr((64, 2**31))
    ds = SparseRowDataset(m)
    items = [ds[i] for i in range(64)]
    return lambda: collate_sparse_rows(items, 2**31)


# ---------------------------------------------------------------- double backward
@case("create_graph: SparseLinearBatch(2**22, 4, sparse_grad), grad of grad")
def _():
    layer = nnsparse.SparseLinearBatch(2**22, 4, sparse_grad=True)
    x = csr((8, 2**22))
    weight_t = dict(layer.named_parameters())["weight_t"]

    def run():
        (g,) = torch.autograd.grad(layer(x).square().sum(), [weight_t], create_graph=True)
        g.coalesce().values().sum().backward()
    return run


@case("create_graph: SparseOutputLinear(4, 2**22, sparse_grad), grad of grad",
      "the bias gradient is summed into an (out_features,) vector, bias-sized (16 MB)")
def _():
    layer = nnsparse.SparseOutputLinear(4, 2**22, sparse_grad=True)
    h = torch.rand(8, 4, requires_grad=True)
    pattern = csr((8, 2**22))

    def run():
        (g,) = torch.autograd.grad(layer(h, pattern).values().square().sum(), [h],
                                   create_graph=True)
        g.sum().backward()
    return run


@case("create_graph: values_map(exp, WIDE), grad of grad")
def _():
    x = coo(WIDE, grad=True)

    def run():
        y = nnsparse.values_map(torch.exp, x).coalesce().values().sum()
        (g,) = torch.autograd.grad(y, [x], create_graph=True)
        g.coalesce().values().sum().backward()
    return run


@case("create_graph: SparseWeightLinear(pattern (4, 2**31)), grad of grad")
def _():
    layer = nnsparse.SparseWeightLinear(coo((4, 2**31)))
    x = coo(WIDE, grad=True)

    def run():
        (g,) = torch.autograd.grad(layer(x).square().sum(), [layer.values], create_graph=True)
        g.sum().backward()
    return run


def _ratings():
    from nnsparse.data import Ratings
    users = torch.randint(0, 2**31, (NNZ,), generator=g).unique()
    items = torch.randint(0, 2**31, (users.shape[0],), generator=g)
    return Ratings.from_triples(users.tolist(), items.tolist(),
                                torch.rand(users.shape[0], generator=g).tolist())


@case("rating_matrix(100 ratings, COO, shape (2**31, 2**31))")
def _():
    from nnsparse.data import rating_matrix
    r = _ratings()
    return lambda: rating_matrix(r, "user", layout=torch.sparse_coo, shape=(2**31, 2**31))


@case("rating_matrix(100 ratings of ids up to 2**31, CSR)", "rows from the id maps: 100")
def _():
    from nnsparse.data import rating_matrix
    r = _ratings()
    return lambda: rating_matrix(r, "user")


# ---------------------------------------------------------------- 2**31 rows
@case("ROWS: values_map(exp, (2**31, 8) coo) fwd+bwd")
def _():
    x = coo(ROWS, grad=True)
    return lambda: _backward(nnsparse.values_map(torch.exp, x))


@case("ROWS: ssort((2**31, 8) coo)", "output (rows, longest row) by documentation")
def _():
    x = coo(ROWS)
    return lambda: nnsparse.ssort(x)


@case("ROWS: to_pairs((2**31, 8) coo)", "a list of one pair tensor per row by documentation")
def _():
    x = coo(ROWS, dtype=torch.float64)
    return lambda: nnsparse.to_pairs(x)


@case("ROWS: sparse_parts((2**31, 8) coo)", "CSR parts: (rows + 1,) pointers by design")
def _():
    x = coo(ROWS)
    return lambda: nnsparse.sparse_parts(x)


@case("ROWS: sparse_mm((2**31, 8) coo, dense (8, 2))", "output (rows, 2) dense by design")
def _():
    x = coo(ROWS)
    d = torch.rand(8, 2)
    return lambda: nnsparse.sparse_mm(x, d)


def _rows_criterion(crit, prepare: bool):
    t = coo(ROWS)
    est = torch.sparse_coo_tensor(t.indices(), torch.rand(NNZ), ROWS).coalesce().requires_grad_()

    def run():
        if prepare:
            crit.prepare_input(t)
        crit(est, t).backward()
    return run


@case("ROWS: SparseCriterion(MSE) sparse est/target fwd+bwd")
def _():
    return _rows_criterion(nnsparse.SparseCriterion(nn.MSELoss()), False)


@case("ROWS: SDAESparseCriterion prepare_input + fwd+bwd")
def _():
    return _rows_criterion(nnsparse.SDAESparseCriterion(nn.MSELoss(), noise_ratio=0.3,
                                                        hide_ratio=0.2, flip_ratio=0.1), True)


@case("ROWS: MaskCriterion prepare_input + fwd+bwd")
def _():
    return _rows_criterion(nnsparse.MaskCriterion(nn.MSELoss(), hide_ratio=0.5), True)


@case("ROWS: SparseWeightLinear(pattern (2**31, 8))",
      "out_features = 2**31: its output (rows, out) and pointers are O(out) by design")
def _():
    p = coo(ROWS)
    return lambda: nnsparse.SparseWeightLinear(p, bias=False)


def run_case(name: str, warm: bool = True) -> Tuple[str, float, str]:
    note, setup = CASES[name]
    torch.manual_seed(0)
    # the cap covers the set-up too (a layer built on a huge pattern allocates there)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_status("VmSize") + 1536 * 2**20, hard))
    try:
        try:
            call = setup()
        except (RuntimeError, MemoryError) as e:
            return "ALLOC-FAIL", float("nan"), "in set-up: " + str(e).splitlines()[0][:100]
        if call is None:
            return "not run", float("nan"), note
        if warm:
            # a first run on inputs of its own: the kernels' code pages, faulted in on
            # first use, would count as the call's memory
            try:
                call()
            except (RuntimeError, MemoryError) as e:
                return "ALLOC-FAIL", float("nan"), (note + " " if note else "") + str(
                    e).splitlines()[0][:100]
            del call
            gc.collect()
            call = setup()
        before = _status("VmRSS")
        _reset_peak()
        try:
            call()
            peak = (_status("VmHWM") - before) / 2**20
            verdict = "ok" if peak <= BUDGET_MB else "OVER"
        except (RuntimeError, MemoryError) as e:
            peak, verdict = float("nan"), "ALLOC-FAIL"
            note = (note + " " if note else "") + str(e).splitlines()[0][:100]
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return verdict, peak, note


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="name",
                   help=f"cases to run, each quoted (default: all {len(CASES)}): "
                        f"{'; '.join(CASES)}")
    p.add_argument("--markdown", action="store_true",
                   help="print the table rows of docs/no_densify_probe.md")
    return p


def main(argv: List[str]) -> None:
    p = _parser()
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in CASES]
    if unknown:
        p.error(f"unknown case {unknown[0]!r} (--help lists the {len(CASES)} cases)")
    markdown = args.markdown
    for name in args.names or list(CASES):
        try:
            verdict, peak, note = run_case(name)
        except Exception:  # a probe bug: show it, go on
            verdict, peak, note = "ERROR", float("nan"), traceback.format_exc().splitlines()[-1]
        if markdown:
            print(f"| {name} | {peak:.1f} | {verdict} | {note} |")
        else:
            print(f"{verdict:10s} {peak:8.1f} MB  {name}  {note}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
