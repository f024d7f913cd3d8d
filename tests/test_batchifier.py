"""Batchifier: one big forward / torch.topk as references, bounded memory, modes restored."""
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import nnsparse
from matrix import BATCH_FORMS, DEVICES, TOL, LargestTensor, make_form, random_sparse_dense

ROWS, WIDTH, OUT = 23, 9, 4
DATA_KINDS = BATCH_FORMS + ["dense", "dataset", "dataset_pairs"]


class Rows(Dataset):
    """A map-style dataset of one item per row."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _data(dense, kind):
    if kind == "dense":
        return dense
    if kind == "dataset":
        return Rows(make_form(dense, "list"))
    if kind == "dataset_pairs":
        return Rows(make_form(dense, "pair_list"))
    return make_form(dense, kind)


def _net(width=WIDTH, out=OUT, dtype=torch.float64, device="cpu", seed=0):
    """Densify (so every data kind is accepted), a dense layer, and a Dropout that
    makes the output differ unless the network runs in eval mode."""
    torch.manual_seed(seed)
    return nn.Sequential(nnsparse.Densify(width), nn.Linear(width, out), nn.Dropout(0.5)).to(
        device=device, dtype=dtype)


class AnyInput(nn.Module):
    """Densify sparse batches, pass dense ones: a network for every data kind."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        if isinstance(x, torch.Tensor) and x.layout == torch.strided:
            return self.net[1:](x)
        return self.net(x)


def _dense(rows=ROWS, width=WIDTH, device="cpu", empty_rows=2, density=0.35):
    return random_sparse_dense(rows, width, density, device=device, empty_rows=empty_rows)


def _reference(net, dense):
    net.eval()
    with torch.no_grad():
        out = net[1:](dense)
    net.train()
    return out


# -- forward ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_size", [1, 5, 256])
@pytest.mark.parametrize("kind", DATA_KINDS)
def test_forward_equals_one_big_forward(kind, batch_size, device):
    dense = _dense(device=device)
    net = AnyInput(_net(device=device))
    out = nnsparse.Batchifier(net, OUT, batch_size=batch_size, progress=False)(_data(dense, kind))
    expected = _reference(net.net, dense)
    assert out.shape == (ROWS, OUT) and out.dtype == torch.float64
    assert out.device == (torch.device("cpu") if kind.startswith("dataset") else dense.device)
    assert not out.is_inference()
    torch.testing.assert_close(out.to(expected.device), expected, **TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
def test_batches_moved_to_device_result_stays_with_data(device):
    dense = _dense()
    net = _net(device=device)
    seen = []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    out = nnsparse.Batchifier(net, OUT, batch_size=10, device=device, progress=False)(
        make_form(dense, "coo"))
    assert out.device.type == "cpu"
    assert {b.device.type for b in seen} == {torch.device(device).type}
    torch.testing.assert_close(out, _reference(net, dense.to(device)).cpu(), **TOL[torch.float64])


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
@pytest.mark.parametrize("form", ["coo_uncoalesced", "list", "csr"])
def test_network_receives_coalesced_batches_of_layout(form, layout):
    dense = _dense()
    seen = []
    net = _net()
    net.register_forward_pre_hook(lambda module, args: seen.append((args[0], args[0].to_dense())))
    nnsparse.Batchifier(net, OUT, batch_size=7, layout=layout, progress=False)(make_form(dense, form))
    assert [tuple(b.shape) for b, _ in seen] == [(7, WIDTH)] * 3 + [(2, WIDTH)]
    assert all(b.layout == layout for b, _ in seen)
    if layout == torch.sparse_coo:
        assert all(b.is_coalesced() for b, _ in seen)
    torch.testing.assert_close(torch.cat([d for _, d in seen]), dense)


@pytest.mark.parametrize("kind", DATA_KINDS)
def test_no_rows(kind):
    empty = torch.zeros(0, WIDTH, dtype=torch.float64)
    uncoalesced = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64),
                                          torch.zeros(0, dtype=torch.float64), (0, WIDTH))
    data = {"list": [], "pair_list": [], "dataset": Rows([]), "dataset_pairs": Rows([]),
            "coo_uncoalesced": uncoalesced}.get(kind, None)
    data = _data(empty, kind) if data is None else data
    run = nnsparse.Batchifier(AnyInput(_net()), OUT, progress=False)
    out = run(data)
    assert out.shape == (0, OUT)
    best = run.topk(data, 2)
    assert best.values.shape == best.indices.shape == (0, 2)
    assert best.indices.dtype == torch.int64


def test_dataset_with_collate_fn():
    dense = _dense()
    items = [(i, row) for i, row in enumerate(make_form(dense, "list"))]
    calls = []

    def collate(batch):
        calls.append([i for i, _ in batch])
        return torch.stack([row.to_dense() for _, row in batch])  # the network takes dense rows

    net = _net()
    run = nnsparse.Batchifier(net[1:], OUT, batch_size=10, progress=False, collate_fn=collate)
    out = run(Rows(items))
    assert calls == [list(range(10)), list(range(10, 20)), list(range(20, 23))]
    torch.testing.assert_close(out, _reference(net, dense), **TOL[torch.float64])


@pytest.mark.parametrize("target", [False, True])
@pytest.mark.parametrize("ds_layout", [torch.sparse_csr, torch.sparse_coo])
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_sparse_row_dataset_needs_no_collate_fn(layout, ds_layout, target):
    # nnsparse's own dataset: its input rows reach the network in the Batchifier's layout,
    # as wide as its matrix (a pattern for exclude=True), whatever its target
    from nnsparse.data import SparseRowDataset
    dense = _dense()
    x = dense.to_sparse_csr()
    ds = SparseRowDataset(x, x if target else None, layout=ds_layout)
    seen = []
    net = _net(out=WIDTH)  # output columns = input columns, for exclude=True

    def spy(module, args):
        seen.append((args[0].layout, args[0].shape[1]))
    net.register_forward_pre_hook(spy)
    run = nnsparse.Batchifier(net, WIDTH, batch_size=10, progress=False, layout=layout)
    torch.testing.assert_close(run(ds), _reference(net, dense), **TOL[torch.float64])
    assert set(seen) == {(layout, WIDTH)}
    best = run.topk(ds, 2, exclude=True)
    expected = run.topk(x, 2, exclude=True)
    assert torch.equal(best.indices, expected.indices)


@pytest.mark.parametrize("device", DEVICES)
def test_dataset_collated_into_a_namedtuple_is_moved(device):
    from collections import namedtuple

    Batch = namedtuple("Batch", "index input")
    dense = _dense()
    items = list(enumerate(make_form(dense, "list")))
    seen = []

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _net(device=device)

        def forward(self, batch):
            seen.append((batch.index.device.type, batch.input.device.type))
            return self.net(batch.input)

    def collate(rows):
        return Batch(torch.tensor([i for i, _ in rows]), torch.stack([r for _, r in rows]))

    net = Net()
    out = nnsparse.Batchifier(net, OUT, batch_size=8, device=device, progress=False,
                              collate_fn=collate)(Rows(items))
    assert set(seen) == {(torch.device(device).type,) * 2}
    torch.testing.assert_close(out, _reference(net.net, dense.to(device)).cpu(),
                               **TOL[torch.float64])


def test_iterable_dataset_is_refused():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(TypeError, match=r"data must be a map-style Dataset with a length, "
                                        r"got Stream without __len__"):
        nnsparse.Batchifier(_net(), OUT, progress=False)(Stream())


# -- train/eval mode -------------------------------------------------------------------
def test_modes_restored_and_eval_during_run():
    net = _net()
    net.train()
    net[2].eval()  # a frozen submodule keeps its own mode
    modes = []
    net.register_forward_pre_hook(lambda module, args: modes.append(
        (module.training, torch.is_inference_mode_enabled())))
    run = nnsparse.Batchifier(net, OUT, batch_size=8, progress=False)
    run(make_form(_dense(), "csr"))
    run.topk(make_form(_dense(), "csr"), 2)
    assert modes == [(False, True)] * 6
    assert [m.training for m in net.modules()] == [True, True, True, False]
    assert not torch.is_inference_mode_enabled()


def test_modes_restored_after_an_exception():
    class FailsAtSecondBatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.inner = nn.Linear(WIDTH, OUT).double()

        def forward(self, x):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("boom")
            return self.inner(x.to_dense())

    net = FailsAtSecondBatch().train()
    with pytest.raises(RuntimeError, match="boom"):
        nnsparse.Batchifier(net, OUT, batch_size=5, progress=False)(make_form(_dense(), "csr"))
    assert net.training and net.inner.training


# -- progress bar ----------------------------------------------------------------------
@pytest.mark.parametrize("progress", [True, False])
def test_progress_bar(progress, capsys):
    run = nnsparse.Batchifier(_net(), OUT, batch_size=5, progress=progress)
    run(make_form(_dense(), "csr"))
    run.topk(make_form(_dense(), "csr"), 1)
    err = capsys.readouterr().err
    if progress:
        assert "Batchifier.forward" in err and "Batchifier.topk" in err and f"{ROWS}/{ROWS}" in err
    else:
        assert err == ""


# -- bounded memory --------------------------------------------------------------------
@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "list"])
def test_forward_memory_bounded_by_batch_size(form):
    rows, width, out, batch = 300, 500, 3, 16
    dense = random_sparse_dense(rows, width, 0.02)
    data = make_form(dense, form)
    nnz = int((dense != 0).sum()) * (2 if form == "coo_uncoalesced" else 1)
    run = nnsparse.Batchifier(_net(width, out), out, batch_size=batch, progress=False)
    with LargestTensor() as seen:
        result = run(data)
    # The data's own O(nnz) normalisation (its (2, nnz) COO indices included),
    # one (batch, width) dense batch, the (rows, out) result: never the
    # (rows, width) densification.
    assert seen.numel <= max(batch * width, 2 * nnz, rows * out), seen.op
    assert seen.numel < rows * width
    torch.testing.assert_close(result, _reference(run.network, dense))


@pytest.mark.parametrize("exclude", [None, True])
def test_topk_never_holds_all_outputs(exclude):
    rows, width, out, batch, k = 300, 400, 400, 16, 5
    dense = random_sparse_dense(rows, width, 0.02)
    data = make_form(dense, "csr")
    nnz = int((dense != 0).sum())
    torch.manual_seed(0)
    net = nn.Sequential(nnsparse.Densify(width), nn.Linear(width, 8), nn.Linear(8, out)).double()
    run = nnsparse.Batchifier(net, out, batch_size=batch, progress=False)
    with LargestTensor() as seen:
        best = run.topk(data, k, exclude=exclude)
    assert seen.numel <= max(batch * max(width, out), nnz, rows * k), seen.op
    assert seen.numel < rows * out
    assert best.values.shape == (rows, k)


# -- topk ------------------------------------------------------------------------------
def _reference_topk(scores, k, excluded=None):
    if excluded is not None:
        scores = scores.masked_fill(excluded, float("-inf"))
    return torch.topk(scores, k, dim=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_size", [1, 6, 256])
@pytest.mark.parametrize("kind", DATA_KINDS)
def test_topk_equals_torch_topk(kind, batch_size, device):
    dense = _dense(width=OUT + 5, device=device)
    torch.manual_seed(3)
    net = AnyInput(nn.Sequential(nnsparse.Densify(OUT + 5), nn.Linear(OUT + 5, 12))
                   .double().to(device))
    run = nnsparse.Batchifier(net, 12, batch_size=batch_size, progress=False)
    full = run(_data(dense, kind))
    best = run.topk(_data(dense, kind), 3)
    assert isinstance(best, torch.return_types.topk)
    expected = _reference_topk(full, 3)
    torch.testing.assert_close(best.values, expected.values)
    torch.testing.assert_close(best.indices, expected.indices)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", BATCH_FORMS + ["dataset", "dataset_pairs"])
def test_topk_excludes_the_rows_input_entries(kind, device):
    width = 12  # the input columns are the output columns (an autoencoder)
    dense = _dense(width=width, device=device, density=0.3)
    net = nn.Sequential(nnsparse.Densify(width), nn.Linear(width, width)).double().to(device)
    run = nnsparse.Batchifier(net, width, batch_size=5, progress=False)
    best = run.topk(_data(dense, kind), 4, exclude=True)
    expected = _reference_topk(run(_data(dense, kind)).to(device), 4, dense != 0)
    finite = expected.values.isfinite()
    assert bool(finite.all()), "the reference needs 4 candidates in every row"
    torch.testing.assert_close(best.values.to(device), expected.values)
    torch.testing.assert_close(best.indices.to(device), expected.indices)


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "list", "pair_list"])
def test_topk_excludes_a_given_pattern(form):
    dense = _dense()
    rated = random_sparse_dense(ROWS, OUT + 3, 0.3, generator=torch.Generator().manual_seed(9))
    rated[:, -1] = 0  # narrower than output_size is fine
    rated[4, 2] = 0.0
    net = AnyInput(nn.Sequential(nnsparse.Densify(WIDTH), nn.Linear(WIDTH, OUT + 3)).double())
    run = nnsparse.Batchifier(net, OUT + 3, batch_size=4, progress=False)
    exclude = make_form(rated, form)
    if form == "pair_list":
        exclude[4] = torch.cat([exclude[4], torch.tensor([[2., 0.]], dtype=torch.float64)])
        rated[4, 2] = 1  # an explicit zero is a specified entry: excluded too
    best = run.topk(make_form(dense, "csr"), 3, exclude=exclude)
    expected = _reference_topk(run(dense), 3, rated != 0)
    torch.testing.assert_close(best.values, expected.values)
    torch.testing.assert_close(best.indices, expected.indices)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_topk_exclude_true_with_either_batch_layout(layout):
    dense = _dense(width=OUT + 8)
    net = nn.Sequential(nnsparse.Densify(OUT + 8), nn.Linear(OUT + 8, OUT + 8)).double()
    run = nnsparse.Batchifier(net, OUT + 8, batch_size=6, progress=False, layout=layout)
    best = run.topk(make_form(dense, "coo_uncoalesced"), 3, exclude=True)
    expected = _reference_topk(run(make_form(dense, "coo")), 3, dense != 0)
    torch.testing.assert_close(best.values, expected.values)
    torch.testing.assert_close(best.indices, expected.indices)


def test_topk_rows_with_fewer_candidates_than_k():
    out = 6
    dense = torch.zeros(3, out, dtype=torch.float64)
    dense[0, :5] = 1.0  # one candidate left
    dense[1] = 2.0  # none left
    net = nn.Sequential(nnsparse.Densify(out), nn.Linear(out, out)).double()
    run = nnsparse.Batchifier(net, out, batch_size=2, progress=False)
    best = run.topk(make_form(dense, "csr"), 3, exclude=True)
    finite = best.values.isfinite()
    assert finite.tolist() == [[True, False, False], [False, False, False], [True, True, True]]
    assert best.indices[0, 0] == 5
    for row in range(2):  # the -inf places point at distinct excluded columns
        padding = best.indices[row][~finite[row]]
        assert padding.unique().numel() == padding.numel()
        assert bool((dense[row, padding] != 0).all())
    torch.testing.assert_close(best.values[2],
                               torch.topk(run(make_form(dense, "csr"))[2], 3).values)


def test_topk_k_zero_and_k_equal_output_size():
    run = nnsparse.Batchifier(_net(), OUT, batch_size=5, progress=False)
    data = make_form(_dense(), "csr")
    assert run.topk(data, 0).values.shape == (ROWS, 0)
    best = run.topk(data, OUT)
    torch.testing.assert_close(best.values, run(data).sort(1, descending=True).values)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
def test_topk_integer_scores_left_out_at_the_dtype_minimum(dtype):
    run = nnsparse.Batchifier(nn.Identity(), 3, progress=False)
    scores = torch.tensor([[1, 0, 2], [3, 2, 1]], dtype=dtype)
    exclude = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]).to_sparse()
    best = run.topk(scores, 2, exclude=exclude)
    assert best.values.dtype == dtype
    assert best.values.tolist() == [[2, 1], [2, 1]] and best.indices.tolist() == [[2, 0], [1, 2]]
    fewer = run.topk(scores, 3, exclude=exclude, candidates=torch.tensor([True, True, False]))
    lowest = torch.iinfo(dtype).min
    assert fewer.values.tolist() == [[1, lowest, lowest], [2, lowest, lowest]]


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_topk_refuses_scores_without_order(dtype):
    run = nnsparse.Batchifier(nn.Identity(), 3, progress=False)
    with pytest.raises(TypeError, match=f"topk ranks real scores, the network returned dtype "
                                        f"{dtype}"):
        run.topk(torch.ones(1, 3, dtype=dtype), 1)


# -- errors ----------------------------------------------------------------------------
def test_errors():
    net = _net()
    data = make_form(_dense(), "csr")
    run = nnsparse.Batchifier(net, OUT, progress=False)
    with pytest.raises(TypeError, match=r"network must be an nn.Module, got function"):
        nnsparse.Batchifier(lambda x: x, OUT)
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1, got 0"):
        nnsparse.Batchifier(net, OUT, batch_size=0)
    with pytest.raises(ValueError, match=r"output_size must be an int >= 0, got -2"):
        nnsparse.Batchifier(net, -2)
    with pytest.raises(TypeError, match=r"layout must be torch.sparse_csr or torch.sparse_coo"):
        nnsparse.Batchifier(net, OUT, layout=torch.strided)
    with pytest.raises(TypeError, match=r"data must be a sparse matrix.*got str"):
        run("ratings.csv")
    with pytest.raises(ValueError, match=r"data must be a batch \(rows, width\), got a single vector"):
        run(torch.ones(WIDTH).to_sparse())
    with pytest.raises(ValueError, match=r"data must be a 2-D \(rows, width\) tensor, got shape \(9,\)"):
        run(torch.ones(WIDTH))
    with pytest.raises(ValueError, match=r"network must return a dense tensor of shape \(23, 5\), "
                                         r"got shape \(23, 4\)"):
        nnsparse.Batchifier(net, OUT + 1, progress=False)(data)
    with pytest.raises(ValueError, match=r"k must be at most output_size \(4\), got 5"):
        run.topk(data, 5)
    with pytest.raises(ValueError, match=r"k must be a non-negative int, got -1"):
        run.topk(data, -1)
    for k in ("2", 2.0, True):  # another kind than an int
        with pytest.raises(TypeError, match=f"k must be a non-negative int, got {k!r}"):
            run.topk(data, k)
    assert run.topk(data, __import__("numpy").int16(2)).indices.shape == (ROWS, 2)  # numpy ints pass
    with pytest.raises(ValueError, match=r"exclude must have the data's 23 rows, got 3 rows"):
        run.topk(data, 2, exclude=torch.eye(3, OUT).to_sparse())
    with pytest.raises(ValueError, match=r"exclude has width 9, larger than output_size 4$"):
        run.topk(data, 2, exclude=data)
    with pytest.raises(TypeError, match=r"exclude must be None, a bool or a sparse matrix"):
        run.topk(data, 2, exclude=torch.ones(ROWS, OUT))
    with pytest.raises(TypeError, match=r"exclude=True needs sparse batches"):
        nnsparse.Batchifier(net[1:], OUT, progress=False).topk(torch.ones(ROWS, WIDTH,
                                                                         dtype=torch.float64), 2,
                                                              exclude=True)
    with pytest.raises(ValueError, match=r"exclude=True needs the data's columns to be output "
                                         r"columns: width 9 is larger than output_size 4"):
        run.topk(data, 2, exclude=True)
    dense_batches = nnsparse.Batchifier(net[1:], OUT, progress=False,
                                        collate_fn=lambda rows: torch.stack(rows).to_dense())
    with pytest.raises(TypeError, match=r"exclude=True needs sparse batches"):
        dense_batches.topk(Rows(make_form(_dense(), "list")), 2, exclude=True)
    with pytest.raises(ValueError, match=r"a batch of width 9 is larger than output_size 4"):
        run.topk(Rows(make_form(_dense(), "list")), 2, exclude=True)


@pytest.mark.parametrize("progress, shown", [(True, True), (False, False), (None, False)])
def test_progress_none_follows_tqdm_terminal_rule(capsys, progress, shown):
    """progress=None: a bar only when stderr is a terminal (it is captured here)."""
    dense = torch.rand(6, WIDTH, dtype=torch.float64)
    nnsparse.Batchifier(_net(), OUT, batch_size=2, progress=progress)(dense.to_sparse())
    assert ("Batchifier" in capsys.readouterr().err) == shown
