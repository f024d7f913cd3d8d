"""No hidden densification: huge logical shapes with few entries stay O(nnz).

The findings of docs/no_densify_probe.md, each pinned: ``LargestTensor`` (a
dispatch mode that sees every op, forward and backward) bounds the largest
tensor a call makes, and a subprocess runs the probe's cases under an
address-space cap.  The widths are chosen so that the old code's O(width)
buffers stay affordable (tens of MB) while failing the bounds.
"""
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

import nnsparse
from nnsparse import _index
from nnsparse._forms import as_sparse_batch
from nnsparse.layers import SparseLinearBatch, SparseWeightLinear

from matrix import LargestTensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def LargestNewTensor() -> LargestTensor:
    """:class:`LargestTensor` counting new allocations only (not views of the arguments)."""
    return LargestTensor(new_only=True)


def _coo(shape, nnz, seed, dtype=torch.float64, cols=None):
    g = torch.Generator().manual_seed(seed)
    row = torch.randint(0, shape[0], (nnz,), generator=g)
    col = cols if cols is not None else torch.randint(0, shape[1], (nnz,), generator=g)
    values = torch.rand(nnz, generator=g, dtype=dtype) + 0.5
    return torch.sparse_coo_tensor(torch.stack([row, col]), values, shape).coalesce()


def test_sparse_weight_linear_on_a_huge_width_is_o_nnz():
    """The transposed structure covers the pattern's distinct columns only: no
    ``(in_features + 1,)`` pointers at construction, none in a sparse forward or backward."""
    width = 2**24
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, width, (40,), generator=g)  # columns both the pattern and x use
    with LargestTensor() as seen:
        layer = SparseWeightLinear(_coo((5, width), 40, 1, cols=shared)).double()
        x = _coo((6, width), 40, 2, cols=shared.flip(0)).requires_grad_()
        y = layer(x)
        y.square().sum().backward()
    assert seen.numel < 10_000, seen.op
    # the same product over the union of the columns, made dense there
    union, inverse = torch.cat([layer.col.long(), x.indices()[1]]).unique(return_inverse=True)
    w_small = torch.zeros(5, union.shape[0], dtype=torch.float64)
    w_small[layer.row, inverse[:layer.nnz]] = layer.values.detach()
    x_small = torch.zeros(6, union.shape[0], dtype=torch.float64)
    x_small[x.indices()[0], inverse[layer.nnz:]] = x.values().detach()
    x_small.requires_grad_()
    want = x_small @ w_small.t() + layer.bias.detach()
    torch.testing.assert_close(y, want)
    want.square().sum().backward()
    torch.testing.assert_close(x.grad.coalesce().values(),
                               x_small.grad[x.indices()[0], inverse[layer.nnz:]])


def test_sparse_weight_linear_dense_input_keeps_its_gradient():
    """A dense input's gradient still reads pointers over every column (built on demand)."""
    pattern = _coo((3, 7), 6, 3)
    layer = SparseWeightLinear(pattern).double()
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()
    w = layer.weight.to_dense().detach()
    torch.testing.assert_close(x.grad, torch.ones(4, 3, dtype=torch.float64) @ w)


def test_sparse_grad_backward_of_a_wide_layer_is_o_nnz():
    """``sparse_grad=True``: the weight's gradient over the touched columns, made from
    a sort of the entries, never ``(in_features,)`` pointers or counts."""
    width = 2**20
    torch.manual_seed(0)
    layer = SparseLinearBatch(width, 4, sparse_grad=True).double()
    dense = SparseLinearBatch(width, 4).double()
    dense.load_state_dict(layer.state_dict())
    x = _coo((8, width), 100, 4)
    with LargestNewTensor() as seen:
        layer(x).square().sum().backward()
    assert seen.numel < width // 16, seen.op
    dense(x).square().sum().backward()
    grad = dict(layer.named_parameters())["weight_t"].grad  # (in_features, 4): touched rows
    dense_grad = dense.weight.grad.t()  # (in_features, 4)
    assert grad.layout == torch.sparse_coo
    touched = grad._indices()[0]
    assert torch.equal(touched, x.indices()[1].unique())
    torch.testing.assert_close(grad._values(), dense_grad[touched])
    assert torch.count_nonzero(dense_grad.abs().sum(1)) == touched.shape[0]


@pytest.mark.parametrize("kind", ["adam", "rowwise_adagrad"])
def test_a_lazy_in_backward_step_of_a_tall_table_is_o_nnz(kind):
    """The in-backward optimiser's CPU row update takes the touched rows from the sort of
    the entries; the pointers over every table row are made for the dense step only."""
    width = 2**20
    torch.manual_seed(0)
    layer = SparseLinearBatch(width, 4).double()
    reference = SparseLinearBatch(width, 4, sparse_grad=True).double()
    reference.load_state_dict(layer.state_dict())
    nnsparse.optim.apply_optimizer_in_backward(layer, kind, lr=0.1)
    x = _coo((8, width), 100, 10)
    with LargestNewTensor() as seen:
        layer(x).square().sum().backward()
    assert seen.numel < width // 16, seen.op
    # the same step as the optimiser on materialised sparse gradients (lazy: touched rows)
    opt = (nnsparse.optim.LazyAdam(reference.parameters(), lr=0.1) if kind == "adam"
           else None)
    if opt is not None:
        reference(x).square().sum().backward()
        opt.step()
        torch.testing.assert_close(layer.weight.detach(), reference.weight.detach())
    else:
        moved = (layer.weight.detach() != reference.weight.detach()).any(0)
        assert torch.equal(moved.nonzero().squeeze(1), x.indices()[1].unique())


def _sampled_wide(kind, h, w, x, layer=None):
    """One call of the large-weight sampled product on a wide pattern ``x``: forward
    only, forward and ``sparse_grad`` backward, or ``layer``'s with its in-backward step."""
    if kind == "forward":
        with torch.no_grad():
            return nnsparse.sampled_linear(h, w, None, x)
    out = (layer(h, x) if kind == "in_backward"
           else nnsparse.sampled_linear(h, w, None, x, sparse_grad=True))
    out.values().square().sum().backward()
    return out


@pytest.mark.parametrize("kind", ["forward", "sparse_grad", "in_backward"])
def test_large_weight_sampled_product_of_a_wide_layer_is_o_nnz(monkeypatch, kind):
    """A CPU weight over ``_COLUMN_MAJOR_ABOVE`` (here also over ``_BLOCK_ABOVE``, read in
    blocks) is sampled in column-major order; with more than
    2 weight rows per entry, over the used rows only: no ``(out_features + 1,)``
    pointers in the forward, nor in a ``sparse_grad`` or in-backward-optimiser
    backward.  The values and gradients are the dense product's."""
    from nnsparse import _kernels
    width = 2**20
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 1 << 20)  # the 32 MB weight is large
    x = _coo((8, width), 100, 13).to_sparse_csr()
    g = torch.Generator().manual_seed(14)
    h = torch.randn(8, 4, generator=g, dtype=torch.float64, requires_grad=kind == "sparse_grad")
    w = torch.randn(width, 4, generator=g, dtype=torch.float64)
    layer = None
    if kind == "in_backward":
        layer = nnsparse.SparseOutputLinear(4, width, bias=False).double()
        with torch.no_grad():
            layer.weight.copy_(w)
        nnsparse.optim.apply_optimizer_in_backward(layer, "rowwise_adagrad", lr=0.1)
        _sampled_wide(kind, h, w, _coo((8, width), 100, 15).to_sparse_csr(), layer)  # state
        w = layer.weight.detach().clone()
    w_ref = w.clone()
    w.requires_grad_(kind == "sparse_grad")
    with LargestNewTensor() as seen:
        out = _sampled_wide(kind, h, w, x, layer)
    assert seen.numel < width // 16, seen.op
    row, col = x.to_sparse_coo().indices()
    hd, wd = h.detach().clone().requires_grad_(), w_ref.clone().requires_grad_()
    want = (hd @ wd.t())[row, col]
    torch.testing.assert_close(out.values(), want)
    if kind == "in_backward":  # the touched weight rows only moved
        moved = (layer.weight.detach() != w_ref).any(1).nonzero().squeeze(1)
        assert torch.equal(moved, col.unique())
    elif kind == "sparse_grad":
        want.square().sum().backward()
        torch.testing.assert_close(h.grad, hd.grad)
        grad = w.grad.coalesce()
        assert torch.equal(grad.indices()[0], col.unique())
        torch.testing.assert_close(grad.values(), wd.grad[col.unique()])


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "empty"])
@pytest.mark.parametrize("first", ["column_major", "column_major_all", "wider_all"])
def test_column_major_and_column_major_all_agree_whichever_comes_first(form, first):
    """Both orders from one sort (the second derived from the first), equal to the
    structure built from scratch; ``column_major_all`` also at a wider width, and
    ``column_major`` derived from it when only the wider one is cached."""
    g = torch.Generator().manual_seed(5)
    nnz = 0 if form == "empty" else 30
    row, col = torch.randint(0, 6, (nnz,), generator=g), torch.randint(0, 50, (nnz,), generator=g)
    x = torch.sparse_coo_tensor(torch.stack([row, col]), torch.rand(nnz, generator=g), (6, 50))
    x = x.to_sparse_csr() if form == "csr" else x if form == "coo_uncoalesced" else x.coalesce()

    def fresh():
        return as_sparse_batch(x).sorted_by_row()
    reference = fresh()
    want_all = _index.column_major_all(reference.row, reference.col, 50)
    counts = want_all[1].diff()
    cols = counts.nonzero().squeeze(1)
    want = (want_all[0], cols, _index.crow_from_counts(counts[cols]), want_all[2])
    batch = fresh()
    _index.COUNTS.clear()
    if first == "column_major":
        got = batch.column_major()
        got_all = batch.column_major_all(50)
    elif first == "column_major_all":
        got_all = batch.column_major_all(50)
        got = batch.column_major()
    else:  # column_major_all cached at another width only: column_major derived from it
        batch.column_major_all(64)
        got = batch.column_major()
        got_all = batch.column_major_all(50)
    built = 2 if first == "wider_all" else 1
    assert _index.COUNTS["column_major_all"] == built and _index.COUNTS["column_major"] == 1
    assert _index.COUNTS["column_sort"] == 1  # one sort of the entries, either order
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    for a, b in zip(got_all, want_all):
        assert torch.equal(a, b)
    wider = batch.column_major_all(64)
    for a, b in zip(wider, _index.column_major_all(reference.row, reference.col, 64)):
        assert torch.equal(a, b)


_PROBE = """
import sys
sys.path.insert(0, {bench!r})
import no_densify_probe as p
for name in sys.argv[1:]:
    verdict, peak, note = p.run_case(name)
    print(verdict, round(peak, 1), name, note, flush=True)
    assert verdict == "ok" and peak < 50, (name, verdict, peak, note)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                    reason="the probe reads Linux's /proc peak-RSS counters")
def test_probe_cases_stay_small_in_a_capped_process():
    """Fixed cases of benchmarks/no_densify_probe.py in a subprocess whose address
    space is capped (current size + 1.5 GiB): a 2**31-wide pattern, a sparse gradient
    of a 2**22-row table, the sampled product of a 2**22-row weight or a step of the
    optimiser in the backward on a 2**22-row table each add under 50 MB of resident
    memory at their peak (each case's call runs twice: a warm-up, then the measure)."""
    cases = ["SparseWeightLinear(pattern (4, 2**31), 100 nnz) on (8, 2**31) coo fwd+bwd",
             "SparseLinearBatch(2**22, 4, sparse_grad) on (8, 2**22) csr fwd+bwd",
             "sampled_linear(h (8, 4), w (2**22, 4), pattern (8, 2**22)) fwd+bwd",
             # (run repeatedly: a backward after another, without zero_grad(), is refused
             # as gradient accumulation when the in-backward optimiser has a dense part)
             "apply_optimizer_in_backward(adam) SparseLinearBatch(2**22, 4) fwd+bwd",
             "apply_optimizer_in_backward(rowwise_adagrad) SparseOutputLinear(4, 2**22) fwd+bwd"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="131072",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="")
    script = _PROBE.format(bench=os.path.join(ROOT, "benchmarks"))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script, *cases], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == len(cases), done.stdout


def test_mask_criterion_on_a_huge_row_count_is_o_nnz():
    """prepare_input keeps an entry in each row from per-run counts of the row-sorted
    entries, not from ``(rows,)`` counts: a (2**24, 8) batch of 100 entries."""
    crit = nnsparse.MaskCriterion(torch.nn.MSELoss(), hide_ratio=0.5,
                                  generator=torch.Generator().manual_seed(0))
    t = _coo((2**24, 8), 100, 6)
    est = torch.sparse_coo_tensor(t.indices(), torch.rand(100, dtype=torch.float64),
                                  t.shape).coalesce().requires_grad_()
    with LargestNewTensor() as seen:
        crit.prepare_input(t)
        crit(est, t).backward()
    assert seen.numel < 10_000, seen.op


@pytest.mark.parametrize("hide_ratio", [0.3, 0.7, 1.0])
def test_mask_criterion_hides_as_the_per_row_count_rule(hide_ratio):
    """The same entries hidden as the rule "a row whose entries are all drawn keeps
    them all", computed with dense per-row counts, for the same generator."""
    x = _coo((40, 6), 90, 7)
    crit = nnsparse.MaskCriterion(torch.nn.MSELoss(), hide_ratio=hide_ratio,
                                  generator=torch.Generator().manual_seed(3))
    out = crit.prepare_input(x)
    drawn = torch.rand(x._nnz(), generator=torch.Generator().manual_seed(3)) < hide_ratio
    row = x.indices()[0]
    per_row = torch.zeros(40, dtype=torch.int64).index_add_(0, row, drawn.long())
    counts = torch.bincount(row, minlength=40)
    want = drawn & ~(per_row == counts)[row]
    assert torch.equal(crit._sparse_mask.flag, want)
    assert out._nnz() == x._nnz() - int(want.sum())


@pytest.mark.parametrize("nnz,every_column", [(30, True), (4, False), (0, False)])
def test_sparse_weight_linear_both_pointer_forms_agree_with_the_dense_input(nnz, every_column):
    """Pointers over every input column (fewer than 2 x nnz of them) or over the used
    columns only: a sparse input gives what its dense equal gives, values and gradients."""
    pattern = _coo((4, 20), nnz, 8) if nnz else torch.sparse_coo_tensor(
        torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (4, 20))
    layer = SparseWeightLinear(pattern).double()
    assert layer._every_column() is every_column
    xs = _coo((5, 20), 25, 9).requires_grad_()
    xd = xs.detach().to_dense().requires_grad_()
    ys, yd = layer(xs), layer(xd)
    torch.testing.assert_close(ys, yd)
    gs = torch.autograd.grad(ys.square().sum(), (xs, layer.values))
    gd = torch.autograd.grad(yd.square().sum(), (xd, layer.values))
    torch.testing.assert_close(gs[0].to_dense(), gd[0] * (xd != 0))
    torch.testing.assert_close(gs[1], gd[1])


def test_sparse_weight_linear_on_the_meta_device_then_loaded():
    """On the meta device (no data: a place for every position, the distinct columns being
    unknown), then ``to_empty`` and a loaded state: the used-columns form again, and the
    real layer's results."""
    pattern = _coo((4, 40), 4, 11)
    real = SparseWeightLinear(pattern).double()
    meta = SparseWeightLinear(pattern, device="meta", dtype=torch.float64)
    assert meta.t_crow.shape == (5,) and meta.t_cols.shape == (4,)
    assert not meta._every_column()
    assert meta(torch.zeros(2, 40, dtype=torch.float64, device="meta")).shape == (2, 4)
    loaded = meta.to_empty(device="cpu")
    loaded.load_state_dict(real.state_dict())
    assert not loaded._every_column() and loaded.t_cols.shape[0] == real.t_cols.shape[0]
    x = _coo((3, 40), 12, 12)
    torch.testing.assert_close(loaded(x), real(x))


def test_sparse_weight_linear_of_a_huge_width_on_the_meta_device():
    """Built on the meta device (the distinct columns unknown there), ``to_empty`` and a
    loaded state: every buffer stays O(nnz) (pointers over 2**40 columns could not even
    be described: torch's meta cumsum overflowed), and the result is the real layer's."""
    width = 2**40
    pattern = torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [width - 1, 7, 2**33]]),
                                      torch.ones(3), (2, width))
    real = SparseWeightLinear(pattern).double()
    meta = SparseWeightLinear(pattern, device="meta", dtype=torch.float64)
    assert max(b.numel() for b in meta.buffers()) <= real.nnz + 1
    loaded = meta.to_empty(device="cpu")
    loaded.load_state_dict(real.state_dict())
    x = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1, 2], [width - 1, 5, 2**33, 7]]),
                                torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
                                (3, width))
    torch.testing.assert_close(loaded(x), real(x))


def _old_mask_rule(batch, hide):
    """MaskCriterion's rule before the per-run counts (ff3c10e): dense per-row counts."""
    hidden_per_row = torch.zeros_like(batch.row_counts()).index_add_(0, batch.row, hide.long())
    return hide & ~(hidden_per_row == batch.row_counts())[batch.row]


@settings(max_examples=60)
@given(rows=st.integers(1, 6), width=st.integers(1, 5), nnz=st.integers(0, 25),
       ratio=st.sampled_from([0.0, 0.3, 0.6, 1.0]), seed=st.integers(0, 2**16),
       form=st.sampled_from(["coo", "unsorted_duplicates", "csr", "rows", "vector"]))
def test_mask_criterion_flags_as_the_old_per_row_rule(rows, width, nnz, ratio, seed, form):
    """Property: for any batch (duplicates, unsorted entries, empty rows, a vector) and the
    same generator, prepare_input hides exactly what the old dense per-row rule hid."""
    from nnsparse.criteria._entries import unique_entries

    g = torch.Generator().manual_seed(seed)
    rows = 1 if form == "vector" else rows
    idx = torch.stack([torch.randint(0, rows, (nnz,), generator=g),
                       torch.randint(0, width, (nnz,), generator=g)])
    coo = torch.sparse_coo_tensor(idx, torch.rand(nnz, generator=g, dtype=torch.float64) + 1,
                                  (rows, width))
    x = {"coo": lambda: coo.coalesce(), "unsorted_duplicates": lambda: coo,
         "csr": lambda: coo.coalesce().to_sparse_csr(),
         "rows": lambda: [r.coalesce() for r in coo.coalesce().unbind(0)],
         "vector": lambda: coo.coalesce()[0]}[form]()
    crit = nnsparse.MaskCriterion(torch.nn.MSELoss(), hide_ratio=ratio,
                                  generator=torch.Generator().manual_seed(seed))
    crit.prepare_input(x)
    batch = unique_entries(as_sparse_batch(x, name="input"))
    drawn = torch.rand(batch.nnz, generator=torch.Generator().manual_seed(seed)) < ratio
    assert torch.equal(crit._sparse_mask.flag, _old_mask_rule(batch, drawn))


@settings(max_examples=40)
@given(out=st.integers(1, 4), width=st.integers(1, 12), nnz=st.integers(0, 12),
       rows=st.integers(0, 4), x_nnz=st.integers(0, 20), seed=st.integers(0, 2**16),
       form=st.sampled_from(["coo", "unsorted_duplicates", "csr"]))
def test_sparse_weight_linear_sparse_input_as_dense_property(out, width, nnz, rows, x_nnz,
                                                             seed, form):
    """Property: whichever pointer form the pattern gets (both sides of width == 2 x nnz,
    a single column, every column used, an empty pattern) and whatever the sparse input
    (duplicates, unsorted, empty rows or none), output and gradients are the dense input's."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randint(0, out, (nnz,), generator=g),
                       torch.randint(0, width, (nnz,), generator=g)])
    layer = SparseWeightLinear(torch.sparse_coo_tensor(idx, torch.ones(nnz), (out, width)),
                               dtype=torch.float64)
    assert layer._every_column() is (width < 2 * layer.nnz or width == 0)
    x_nnz = x_nnz if rows else 0
    xi = torch.stack([torch.randint(0, max(rows, 1), (x_nnz,), generator=g),
                      torch.randint(0, width, (x_nnz,), generator=g)])
    xv = torch.randn(x_nnz, generator=g, dtype=torch.float64).requires_grad_()
    coo = torch.sparse_coo_tensor(xi, xv, (rows, width))
    x = {"coo": lambda: coo.coalesce(), "unsorted_duplicates": lambda: coo,
         "csr": lambda: coo.coalesce().to_sparse_csr()}[form]()
    dense = torch.zeros(rows, width, dtype=torch.float64).index_put((xi[0], xi[1]), xv,
                                                                     accumulate=True)
    y, want = layer(x), layer(dense)
    torch.testing.assert_close(y, want)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((y * w).sum(), (xv, layer.values), allow_unused=True)
    ref = torch.autograd.grad((want * w).sum(), (xv, layer.values), allow_unused=True)
    for a, b in zip(got, ref):
        if a is None or b is None:  # no entries: no path from the input's values
            assert x_nnz == 0 or layer.nnz == 0
            continue
        torch.testing.assert_close(a, b)
