"""The large-table paths of nnsparse._kernels (column blocks, column-major sampling) and
the exact in-place row update of nnsparse._rowopt for kinds a zero gradient leaves alone.

Both are taken on CPU above a table size (tens of MB); the tests lower the
threshold so that small tables take them, and compare with the one-pass
products, a dense reference and torch.optim.
"""
import copy

import pytest
import torch

import nnsparse
from nnsparse import _index, _kernels, _rowopt
from nnsparse import optim as noptim
from matrix import random_sparse_dense


@pytest.fixture
def small_blocks(monkeypatch):
    """Every CPU table counts as large, read in blocks of 64 bytes."""
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 0)
    monkeypatch.setattr(_kernels, "_BLOCK_BYTES", 64)


def _batch(rows, width, density, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return random_sparse_dense(rows, width, density, dtype=dtype, generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layers_on_a_large_table_match_the_dense_reference(small_blocks, dtype):
    torch.manual_seed(0)
    dense_x = _batch(5, 300, 0.05, 1, dtype)
    enc = nnsparse.SparseLinearBatch(300, 4).to(dtype)
    dec = nnsparse.SparseOutputLinear(4, 300).to(dtype)
    _index.COUNTS.clear()
    x = dense_x.to_sparse()
    out = dec(torch.tanh(enc(x)), x)
    assert _index.COUNTS["blocked"] == 1  # the encoder's blocks, built once
    w_e, w_d = enc.weight.detach().clone().requires_grad_(), dec.weight.detach().clone()
    w_d.requires_grad_()
    h = torch.tanh(dense_x @ w_e.t() + enc.bias.detach())
    ref = (h @ w_d.t() + dec.bias.detach()) * (dense_x != 0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out.to_dense(), ref, **tol)
    g = torch.randn(out.values().shape, dtype=dtype)
    out.values().backward(g)
    ref[dense_x != 0].backward(g)
    torch.testing.assert_close(enc.weight.grad, w_e.grad, **tol)
    torch.testing.assert_close(dec.weight.grad, w_d.grad, **tol)


def test_large_table_gradients_gradcheck(small_blocks):
    dense_x = _batch(4, 40, 0.2, 2)
    x = dense_x.to_sparse()
    w_e = torch.randn(3, 40, dtype=torch.float64, requires_grad=True)
    w_d = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)

    def f(w_e, w_d):
        h = nnsparse.sparse_linear(x, w_e, mode="sparse")
        return nnsparse.sampled_linear(h, w_d, pattern=x).values()
    assert torch.autograd.gradcheck(f, (w_e, w_d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_operator_path_reads_a_large_table_in_blocks(small_blocks, monkeypatch, dtype):
    # the inputs torch.compile sees (SparseParts, nnsparse::* operators), run eagerly:
    # the same values and gradients as the one-pass products
    torch.manual_seed(0)
    dense_x = _batch(5, 300, 0.05, 1, torch.float32).to(dtype)
    enc = nnsparse.SparseLinearBatch(300, 4, mode="sparse").to(dtype)
    dec = nnsparse.SparseOutputLinear(4, 300).to(dtype)

    def run():
        parts = nnsparse.sparse_parts(dense_x.to_sparse())
        out = dec(torch.tanh(enc(parts)), parts).values.float()
        grads = torch.autograd.grad(out.square().sum(), [enc.weight, dec.weight])
        return [out, *grads]
    _index.COUNTS.clear()
    blocked = run()
    # an operator keeps no structure between calls: the encoder's product and the
    # decoder's grad_h each order the entries by block
    assert _index.COUNTS["blocked"] == 2 and _index.COUNTS["column_major_all"] >= 1
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 1 << 40)  # every table read in one pass
    _index.COUNTS.clear()
    one_pass = run()
    assert _index.COUNTS["blocked"] == 0
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for a, b in zip(blocked, one_pass):
        torch.testing.assert_close(a, b, **tol)


def _sampled_case(rows, width, d, nnz, dtype, seed):
    """A trusted row-sorted batch ``(rows, width)`` of ``nnz`` distinct positions, and
    ``h`` ``(rows, d)``, ``weight`` ``(width, d)``: the arguments of ``_sampled_rows``."""
    from nnsparse._forms import SparseBatch
    gen = torch.Generator().manual_seed(seed)
    key = torch.randperm(rows * width, generator=gen)[:nnz].sort().values
    row, col = key // width, key % width
    h = torch.randn(rows, d, generator=gen).to(dtype)
    weight = torch.randn(width, d, generator=gen).to(dtype)
    crow = _index.crow_from_rows(row, rows)

    def pattern():
        return SparseBatch(row, col, h.new_empty(nnz), (rows, width), "csr", row_sorted=True,
                           coalesced=True, trusted=True)
    return pattern, h, weight, crow, row, col


@pytest.mark.parametrize("rows,width,d,nnz,dtype,block_bytes", [
    (9, 1000, 7, 300, torch.float32, 1 << 10),  # used rows in several blocks
    (9, 5000, 64, 100, torch.float64, 1 << 12),
    (9, 300, 3, 2000, torch.float32, 64),  # most rows used, a block of 5 rows
    (3, 50, 5, 10, torch.float16, 64),  # the product in float32, returned in float16
    (4, 40, 3, 12, torch.float64, 512),  # the used rows (264 bytes) in one block
    (2, 64, 2, 1, torch.float32, 8),  # one entry, a block of one row
], ids=["f32-blocks", "f64-blocks", "f32-dense-pattern", "f16", "one-block", "one-entry"])
def test_sampled_rows_over_the_used_rows_is_bitwise_the_every_row_product(
        monkeypatch, rows, width, d, nnz, dtype, block_bytes):
    """The large-weight sampled product over the used weight rows (gathered in blocks;
    O(nnz) pointers, ``column_major``) gives the same bits as over every weight row
    (``column_major_all``, the code before), and the dense product's values."""
    pattern, h, weight, crow, row, col = _sampled_case(rows, width, d, nnz, dtype, 3)
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 0)
    monkeypatch.setattr(_kernels, "_BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(_kernels, "_ALL_ROWS_PER_ENTRY", 1 << 40)
    every_row = _kernels._sampled_rows(pattern(), h, weight, crow, col)
    monkeypatch.setattr(_kernels, "_ALL_ROWS_PER_ENTRY", 0)
    used = pattern()
    _index.COUNTS.clear()
    got = _kernels._sampled_rows(used, h, weight, crow, col)
    assert _index.COUNTS["column_major_all"] == 0 and _index.COUNTS["column_sort"] == 1
    assert got.dtype == dtype and torch.equal(got, every_row)
    want = (h.double() @ weight.double().t())[row, col].to(dtype)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else {}
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("width,form", [(24, "every row"), (25, "used rows")])
def test_sampled_rows_takes_every_row_up_to_two_rows_per_entry(monkeypatch, width, form):
    """Pointers over every weight row while the weight has at most 2 rows per entry."""
    pattern, h, weight, crow, row, col = _sampled_case(4, width, 3, 12, torch.float64, 4)
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 0)
    monkeypatch.setattr(_kernels, "_BLOCK_BYTES", 64)
    _index.COUNTS.clear()
    _kernels._sampled_rows(pattern(), h, weight, crow, col)
    assert _index.COUNTS["column_major_all"] == (form == "every row")
    assert _index.COUNTS["column_major"] == (form == "used rows")


@pytest.mark.parametrize("above,column_major", [(1 << 40, False), (0, True)],
                         ids=["row-major", "column-major"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_rows_order_follows_column_major_above(monkeypatch, above, column_major,
                                                         dtype):
    """A CPU weight over ``_COLUMN_MAJOR_ABOVE`` bytes is sampled in column-major order
    even when it is not read in blocks (``_BLOCK_ABOVE``); the values are the row-major
    product's, bit for bit, and the dense product's."""
    pattern, h, weight, crow, row, col = _sampled_case(6, 40, 5, 50, dtype, 5)
    monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 1 << 40)  # never in blocks
    monkeypatch.setattr(_kernels, "_COLUMN_MAJOR_ABOVE", above)
    assert _kernels._table_blocks(weight) == 1
    assert _kernels._sampled_by_column(weight) == column_major
    _index.COUNTS.clear()
    got = _kernels._sampled_rows(pattern(), h, weight, crow, col)
    assert bool(_index.COUNTS["column_major_all"]) == column_major
    row_major = _kernels._sampled_mm(h, weight.t(), crow, col)
    assert got.dtype == dtype and torch.equal(got, row_major)
    torch.testing.assert_close(got, (h.double() @ weight.double().t())[row, col].to(dtype))


def test_sampled_by_column_is_cpu_and_size():
    """Above 8 MB on CPU (the 12 MB weight of an ML-1M decoder is sampled by column);
    never on another device (the GPU path reads no order from the host)."""
    assert not _kernels._sampled_by_column(torch.empty(1000, 500))  # 2 MB
    assert _kernels._sampled_by_column(torch.empty(6040, 500))  # 12 MB
    assert not _kernels._sampled_by_column(torch.empty(6040, 500, device="meta"))


def test_blocked_order_groups_by_column_span_then_row():
    row = torch.tensor([0, 0, 0, 1, 1, 2])
    col = torch.tensor([0, 5, 9, 1, 8, 4])
    order, crow_b = _index.blocked_order(row, col, rows=3, width=10, blocks=2)
    # span 0 = columns 0-4: (0,0) (1,1) (2,4); span 1 = columns 5-9: (0,5) (0,9) (1,8)
    assert order.tolist() == [0, 3, 5, 1, 2, 4]
    assert crow_b.tolist() == [0, 1, 2, 3, 5, 6, 6]


# int16 keys, int32 keys, then int64 ones (each side of each limit)
@pytest.mark.parametrize("bound", [7, 2**15 - 1, 2**15, 2**31 - 1, 2**31])
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
# lengths each side of the span sorted padded to torch's radix-sort length (CPU, FBGEMM)
@pytest.mark.parametrize("length", [500, _index._PAD_FROM, _index._RADIX_FROM - 1,
                                    _index._RADIX_FROM])
def test_stable_order_is_torch_stable_argsort(bound, dtype, length):
    gen = torch.Generator().manual_seed(0)
    key = torch.randint(0, 7, (length,), generator=gen, dtype=dtype)  # many ties
    key[::50] = min(bound, torch.iinfo(dtype).max + 1) - 1  # the largest key in range
    order = _index.stable_order(key, bound)
    assert order.dtype == torch.int64 and order.shape == key.shape
    assert torch.equal(order, torch.argsort(key, stable=True))


@pytest.mark.parametrize("length", [500, _index._PAD_FROM, _index._RADIX_FROM - 1])
def test_stable_order_keeps_the_keys_device_under_a_default_device(length):
    """Under another default device (torch.set_default_device, a torch.device context, as
    a model built on the meta device), a CPU key's order is made on the CPU: the padding
    of a short key too (it was made on the default device, and a layer's forward read
    garbage indices: "Index 0 of input takes value 140290811756692")."""
    gen = torch.Generator().manual_seed(1)
    key = torch.randint(0, 100, (length,), generator=gen)
    with torch.device("meta"):
        order = _index.stable_order(key, 100)
    assert order.device.type == "cpu" and torch.equal(order, torch.argsort(key, stable=True))
    g = torch.Generator().manual_seed(2)
    x = torch.sparse_coo_tensor(torch.stack([torch.randint(0, 64, (length,), generator=g),
                                             torch.randint(0, 2000, (length,), generator=g)]),
                                torch.rand(length, generator=g), (64, 2000))
    layer = nnsparse.SparseLinearBatch(2000, 3, sparse_grad=True)
    want = layer(x)
    want.square().sum().backward()
    grads = [p.grad.to_dense() for p in layer.parameters()]
    layer.zero_grad()
    with torch.device("meta"):
        got = layer(x)
        got.square().sum().backward()
    assert torch.equal(got, want)
    assert all(torch.equal(p.grad.to_dense(), g) for p, g in zip(layer.parameters(), grads))


@pytest.mark.parametrize("large", [False, True], ids=["one-pass", "used-rows"])
def test_sampled_product_keeps_the_inputs_device_under_a_default_device(monkeypatch, large):
    """SparseOutputLinear on CPU tensors under another default device (a torch.device
    context): its sampled product's CSR mask is built on the tensors' device (torch's
    sparse constructors take the default device unless told: "Could not run
    'aten::sparse_sampled_addmm' with arguments from the 'SparseCsrMeta' backend"),
    giving the plain call's values and gradients, whether the weight is read in one
    pass or over its used rows in blocks."""
    if large:
        monkeypatch.setattr(_kernels, "_BLOCK_ABOVE", 0)
        monkeypatch.setattr(_kernels, "_BLOCK_BYTES", 256)
    g = torch.Generator().manual_seed(2)
    x = torch.sparse_coo_tensor(torch.stack([torch.randint(0, 8, (300,), generator=g),
                                             torch.randint(0, 3000, (300,), generator=g)]),
                                torch.rand(300, generator=g), (8, 3000)).coalesce()
    h = torch.randn(8, 4, generator=g, requires_grad=True)
    layer = nnsparse.SparseOutputLinear(4, 3000, sparse_grad=True)
    got = {}
    for device in ("cpu", "meta"):
        layer.zero_grad()
        h.grad = None
        with torch.device(device):
            y = layer(h, x)
            y.values().square().sum().backward()
        got[device] = (y.to_dense(), h.grad, layer.weight.grad.to_dense())
    assert all(torch.equal(a, b) for a, b in zip(got["cpu"], got["meta"]))


def test_table_blocks():
    assert _kernels._table_blocks(torch.empty(10, 10)) == 1  # small: one pass
    big = torch.empty(0).new_empty((1 << 24) + 1, 1)  # just above 64 MB of float32
    assert _kernels._table_blocks(big) == 9
    assert _kernels._table_blocks(torch.empty((1 << 24) + 1, 1, device="meta")) == 1


def test_many_rows_read_the_table_in_one_pass(small_blocks, monkeypatch):
    # the partial sums of the blocks would outgrow the table: one embedding_bag
    seen = []
    monkeypatch.setattr(_index, "blocked_order", lambda *a: seen.append(a) or 1 / 0)
    x = _batch(30, 50, 0.1, 3).to_sparse()
    nnsparse.SparseLinearBatch(50, 2).double()(x)
    assert seen == []


# -- row updates a zero gradient leaves unchanged -------------------------------------
@pytest.mark.parametrize("kind,hp,dtype,neutral", [
    ("rowwise_adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.0), torch.float32, True),
    ("rowwise_adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.1), torch.float32, False),
    ("rowwise_adagrad", dict(lr=0.01, eps=0.0, weight_decay=0.0), torch.float32, False),
    # float16: lr / eps must stay finite (1e-10 is 0 there, and 0 * inf is NaN)
    ("rowwise_adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.0), torch.float16, False),
    ("rowwise_adagrad", dict(lr=0.01, eps=1e-3, weight_decay=0.0), torch.float16, True),
    ("rowwise_adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.0), torch.bfloat16, True),
    ("adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.0), torch.float64, True),
    ("adagrad", dict(lr=0.01, eps=1e-10, weight_decay=0.0), torch.float16, False),
    # 1.5267e-5 rounds in float16 to a value whose reciprocal overflows
    ("rowwise_adagrad", dict(lr=0.01, eps=1.5267e-5, weight_decay=0.0), torch.float16, False),
    ("sgd", dict(lr=0.1, momentum=0.0, weight_decay=0.0), torch.float16, True),
    ("sgd", dict(lr=0.1, momentum=0.9, weight_decay=0.0), torch.float32, False),
    ("adam", dict(lr=0.1, eps=1e-8, weight_decay=0.0), torch.float32, False),
    ("adamw", dict(lr=0.1, eps=1e-8, weight_decay=0.0), torch.float32, False),
])
def test_zero_grad_neutral(kind, hp, dtype, neutral):
    assert _rowopt.zero_grad_neutral(kind, hp, dtype) is neutral


@pytest.mark.parametrize("sync_free", [False, True], ids=["row-update", "sync-free"])
@pytest.mark.parametrize("kind", ["rowwise_adagrad", "adagrad"])
def test_float16_untouched_rows_stay_finite(kind, sync_free, monkeypatch):
    """In float16 the default eps is 0: an untouched row's zero gradient over a zero
    accumulator would be 0 * inf = NaN, so these kinds are not taken as neutral there:
    untouched rows keep their values bit for bit."""
    if sync_free:
        monkeypatch.setattr(_kernels, "_SYNC_FREE", ("cpu",))
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(8, 3).half()
    dec = nnsparse.SparseOutputLinear(3, 8).half()
    model = torch.nn.ModuleDict(dict(enc=enc, dec=dec))
    noptim.apply_optimizer_in_backward(model, kind, lr=0.01)
    before_enc, before_dec = enc.weight.detach().clone(), dec.weight.detach().clone()
    dense = _batch(4, 8, 0.9, 20, torch.float16)
    dense[:, 4:] = 0  # columns 4-7: never touched (half of the rows: the dense share)
    x = dense.to_sparse()
    out = dec(torch.tanh(enc(x)), x)
    out.values().float().square().sum().backward()
    for w in (enc.weight, dec.weight):
        assert torch.isfinite(w).all()
    assert torch.equal(enc.weight.detach()[:, 4:], before_enc[:, 4:])
    assert torch.equal(dec.weight.detach()[4:], before_dec[4:])


def _rowwise_reference(p, acc, rows, g, lr, eps):
    p, acc = p.clone(), acc.clone()
    acc[rows] += g.square().mean(1)
    p[rows] -= lr * g / (acc[rows].sqrt() + eps).unsqueeze(1)
    return p, acc


@pytest.mark.parametrize("dense_grad", [False, True], ids=["span", "dense-step"])
def test_neutral_update_of_a_dense_span_is_the_lazy_update(dense_grad):
    """Row-wise Adagrad on rows covering most of their span (updated in place, no save
    and restore) or of the table (the dense step): the untouched rows and accumulators
    stay bit for bit, the touched ones follow the row-wise rule."""
    gen = torch.Generator().manual_seed(5)
    table = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    hp = dict(lr=0.1, eps=1e-10, weight_decay=0.0, dense_above=None)
    state = _rowopt.new_state("rowwise_adagrad", table, 0.5)
    rows = torch.tensor([0, 1, 2, 4, 5, 7])
    g = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    full = torch.zeros(10, 3, dtype=torch.float64).index_copy_(0, rows, g)
    p0, acc0 = table.clone(), state["sum"].clone()
    _rowopt.update_rows("rowwise_adagrad", hp, table, rows, g, state,
                        (lambda a, b: full[a:b]) if dense_grad else None)
    p_ref, acc_ref = _rowwise_reference(p0, acc0, rows, g, 0.1, 1e-10)
    untouched = torch.tensor([3, 6, 8, 9])
    assert torch.equal(table[untouched], p0[untouched])
    assert torch.equal(state["sum"][untouched], acc0[untouched])
    torch.testing.assert_close(table, p_ref)
    torch.testing.assert_close(state["sum"], acc_ref)


@pytest.mark.parametrize("kind,hp", [("adagrad", dict(lr=0.1)), ("sgd", dict(lr=0.1))])
def test_neutral_kinds_in_backward_equal_torch_optim_with_rows_untouched(kind, hp):
    """Adagrad and plain SGD: the in-backward update (dense step above the share, since
    a zero gradient changes nothing) equals torch.optim on the dense gradients, with
    one input column and one output column never touched."""
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(8, 3).double()
    dec = nnsparse.SparseOutputLinear(3, 8).double()
    ours = torch.nn.ModuleDict(dict(enc=enc, dec=dec))
    ref = copy.deepcopy(ours)
    opt = noptim.apply_optimizer_in_backward(ours, kind, **hp)
    ref_opt = (torch.optim.Adagrad if kind == "adagrad" else torch.optim.SGD)(
        ref.parameters(), **hp)
    for seed in range(3):
        dense = _batch(4, 8, 0.6, 10 + seed)
        dense[:, 7] = 0  # column 7: never touched
        x = dense.to_sparse()
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            out = model["dec"](torch.tanh(model["enc"](x)), x)
            (out.values() - x.values()).square().sum().backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_masked_update_takes_the_dense_step_at_the_same_count_as_the_row_update():
    """dense_above * n = 56.99999999999999 (0.57 * 100): 57 touched rows are above it.
    The GPU's step compares the count with an integer bound, as the row update does
    with a float; a float32 product (57.0) would have kept the step lazy."""
    gen = torch.Generator().manual_seed(6)
    hp = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, dense_above=0.57)
    rows = torch.randperm(100, generator=gen)[:57].sort().values
    g = torch.randn(57, 4, generator=gen, dtype=torch.float64)
    full = torch.zeros(100, 4, dtype=torch.float64).index_copy_(0, rows, g)
    table = torch.randn(100, 4, generator=gen, dtype=torch.float64)
    tables, states = [table.clone(), table.clone()], []
    for t in tables:
        states.append(_rowopt.new_state("adam", t))
        states[-1]["exp_avg"].fill_(0.1)  # untouched rows then move under the dense step
    _rowopt.update_rows("adam", hp, tables[0], rows, g, states[0], lambda a, b: full[a:b])
    touched = torch.zeros(100, dtype=torch.bool).index_fill_(0, rows, True)
    _rowopt.update_masked("adam", hp, tables[1], touched, full, states[1])
    assert not torch.equal(tables[0], table)
    torch.testing.assert_close(tables[1], tables[0])
    torch.testing.assert_close(states[1]["exp_avg"], states[0]["exp_avg"])


def _row_update_of(pattern, table, dense, values, kind, dense_above, sync_free, monkeypatch):
    """The table and state after one ``_update_rows_of`` of ``pattern``."""
    monkeypatch.setattr(_kernels, "_SYNC_FREE", ("cpu",) if sync_free else ("cuda",))
    hp = noptim._in_backward_hp(kind, lr=0.1, betas=(0.9, 0.999), eps=None, weight_decay=None,
                                dense_above=dense_above)
    table = table.clone()
    update = _rowopt.TableUpdate(kind, hp, table, "table")
    if "exp_avg" in update.state:
        update.state["exp_avg"].fill_(0.1)  # Adam's dense step then moves untouched rows
    _kernels._update_rows_of(update, table, pattern, dense, values)
    return table, update.state


@pytest.mark.parametrize("sync_free", [False, True], ids=["row-update", "sync-free"])
@pytest.mark.parametrize("dense_above", [None, 0.0], ids=["lazy", "dense-step"])
@pytest.mark.parametrize("kind", ["adam", "rowwise_adagrad"])
def test_update_rows_of_a_pattern_narrower_than_the_table(kind, dense_above, sync_free,
                                                          monkeypatch):
    """A pattern of width 6 on a table of 10 rows updates as the same pattern declared 10
    wide, from one transposed structure (one sort of its entries: the row update read
    column_major_all at two widths, two sorts); rows 6-9, never touched, stay unless the
    dense step moves them (Adam's does, row-wise Adagrad's zero gradient does not)."""
    gen = torch.Generator().manual_seed(4)
    dense_x = _batch(3, 6, 0.5, 8)
    narrow = nnsparse._forms.as_sparse_batch(dense_x.to_sparse())
    wide = nnsparse._forms.as_sparse_batch(torch.cat([dense_x, torch.zeros(3, 4,
                                                      dtype=torch.float64)], 1).to_sparse())
    assert (narrow.width, wide.width) == (6, 10)
    table = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    dense = torch.randn(3, 2, generator=gen, dtype=torch.float64)
    _index.COUNTS.clear()
    got = _row_update_of(narrow, table, dense, narrow.values, kind, dense_above, sync_free,
                         monkeypatch)
    assert _index.COUNTS["column_sort"] == 1
    # the pointers over every table row: for the dense step (row-wise Adagrad takes it
    # above a quarter of the rows touched) or a GPU's masked step only, never a lazy one
    lazy = kind == "adam" and dense_above is None and not sync_free
    assert _index.COUNTS["column_major_all"] == (0 if lazy else 1)
    want = _row_update_of(wide, table, dense, wide.values, kind, dense_above, sync_free,
                          monkeypatch)
    assert torch.equal(got[0], want[0])
    for key in want[1]:
        assert torch.equal(got[1][key], want[1][key]), key
    assert not torch.equal(got[0][:6], table[:6])
    moved = kind == "adam" and dense_above == 0.0
    assert torch.equal(got[0][6:], table[6:]) is not moved


def test_update_rows_of_a_pattern_wider_than_the_table_is_refused(monkeypatch):
    pattern = nnsparse._forms.as_sparse_batch(_batch(2, 8, 0.5, 9).to_sparse())
    with pytest.raises(ValueError, match=r"pattern has width 8, more than the table's 6 rows"):
        _row_update_of(pattern, torch.zeros(6, 2, dtype=torch.float64),
                       torch.zeros(2, 2, dtype=torch.float64), pattern.values, "adam", None,
                       False, monkeypatch)


def test_a_layer_step_in_the_backward_sorts_each_pattern_once():
    """The encoder and the decoder with the optimiser in the backward: one transposed
    structure per pattern (the layers declare their batch as wide as the table)."""
    torch.manual_seed(0)
    enc, dec = nnsparse.SparseLinearBatch(8, 3).double(), nnsparse.SparseOutputLinear(3, 8).double()
    noptim.apply_optimizer_in_backward(torch.nn.ModuleList([enc, dec]), "adam", lr=0.1)
    x, y = _batch(4, 8, 0.5, 11).to_sparse(), _batch(4, 8, 0.5, 12).to_sparse()
    _index.COUNTS.clear()
    dec(torch.tanh(enc(x)), y).values().square().sum().backward()
    assert _index.COUNTS["column_sort"] == 2


@pytest.mark.parametrize("prefetch", [False, True])
def test_bag_rows_blocks_equal_the_whole_product(prefetch):
    """The block products of the in-backward update (with the offsets prefetch makes for
    every block at once, or a block's own) are the whole product's rows, empty bags too."""
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    counts = torch.tensor([2, 0, 3, 1, 0, 0, 4, 2])
    crow = _index.crow_from_counts(counts)
    index = torch.randint(0, 6, (int(crow[-1]),), generator=gen)
    weights = torch.randn(index.shape[0], generator=gen, dtype=torch.float64)
    whole = _kernels._csr_rows_mm(index, table, crow, weights)
    rows = _kernels._bag_rows(index, table, crow, weights)
    points = [1, 3, 4, 8]
    if prefetch:
        rows.prefetch(points)
    for a, b in zip(points[:-1], points[1:]):
        torch.testing.assert_close(rows(a, b), whole[a:b], rtol=0, atol=1e-12)
    torch.testing.assert_close(rows(2, 7), whole[2:7], rtol=0, atol=1e-12)  # not a block
    torch.testing.assert_close(rows(0, 8), whole)


@pytest.mark.parametrize("dense_above", [None, 0.0], ids=["lazy", "dense-step"])
@pytest.mark.parametrize("kind, extra", [
    ("sgd", {}), ("sgd", dict(momentum=0.9)), ("adam", {}), ("adamw", {}), ("adagrad", {}),
    ("rowwise_adagrad", {})], ids=["sgd", "sgd-momentum", "adam", "adamw", "adagrad",
                                   "rowwise_adagrad"])
def test_an_update_in_blocks_is_one_step(kind, extra, dense_above, monkeypatch):
    """Each block's kernel is handed the step (a copy for the kinds whose torch kernel
    advances it, the state's own for SGD and row-wise Adagrad, which never read it): an
    update in blocks of two rows equals the one-block update and the GPU's masked update,
    update after update, and ``step`` counts the updates."""
    hp = noptim._in_backward_hp(kind, lr=0.1, betas=(0.9, 0.999), eps=None, weight_decay=None,
                                dense_above=dense_above, **extra)
    gen = torch.Generator().manual_seed(8)
    table = torch.randn(12, 3, generator=gen, dtype=torch.float64)
    rows = torch.tensor([0, 2, 3, 5, 6, 7, 9, 11])
    touched = torch.zeros(12, dtype=torch.bool).index_fill_(0, rows, True)
    grads = [torch.randn(8, 3, generator=gen, dtype=torch.float64) for _ in range(3)]
    results = []
    for how in ("blocks", "one-block", "masked"):
        monkeypatch.setattr(_rowopt, "_CHUNK", 6 if how == "blocks" else 1 << 20)
        t = table.clone()
        state = _rowopt.new_state(kind, t)
        for count, g in enumerate(grads, 1):
            full = torch.zeros(12, 3, dtype=torch.float64).index_copy_(0, rows, g)
            if how == "masked":
                _rowopt.update_masked(kind, hp, t, touched, full, state)
            else:
                _rowopt.update_rows(kind, hp, t, rows, g, state, lambda a, b: full[a:b])
            assert state["step"].item() == count, how
        results.append((t, state))
    (t0, s0), *others = results
    assert not torch.equal(t0, table)
    for t, state in others:
        torch.testing.assert_close(t, t0)
        for key in s0:
            torch.testing.assert_close(state[key], s0[key])
