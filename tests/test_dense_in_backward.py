"""The optimiser in the backward (nnsparse.optim.apply_optimizer_in_backward,
fused_step_optimizer) with a dense (strided) input to a ``SparseLinearBatch`` and a
``SparseOutputLinear`` called without a pattern (the dense output).

Either specifies every entry: the backward steps every row of the weight (none for an input
of no rows) from its dense gradient through the row-update machinery, the step a sparse
batch (a pattern) holding every entry explicitly gives.  (Both raised NotImplementedError.)
The in-backward mode's checks (stale graph, used twice, accumulation, recorded backward)
hold as for the sparse kernels.
"""
import copy

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import nnsparse
from nnsparse import optim as noptim

IN, HIDDEN, OUT = 7, 4, 6


def _explicit(x):
    """``x`` (dense, 1-D or 2-D) as a sparse COO tensor specifying every entry, zeros too."""
    index = torch.ones_like(x, dtype=torch.bool).nonzero().t()
    return torch.sparse_coo_tensor(index, x.reshape(-1), x.shape, is_coalesced=True)


def _models(sparse_grad=False, bias=True, sizes=(IN, HIDDEN, OUT)):
    torch.manual_seed(0)
    model = nn.ModuleList([
        nnsparse.SparseLinearBatch(sizes[0], sizes[1], bias=bias, sparse_grad=sparse_grad,
                                   mode="sparse", dtype=torch.float64),
        nnsparse.SparseOutputLinear(sizes[1], sizes[2], bias=bias, sparse_grad=sparse_grad,
                                    dtype=torch.float64)])
    return model, copy.deepcopy(model)


def _loss(model, x, y, explicit):
    """Encoder -> tanh -> decoder: on the dense tensors, or on their every-entry sparse forms
    (the encoder's input and the decoder's pattern)."""
    if explicit:
        hidden = torch.tanh(model[0](_explicit(x)))
        out = model[1](hidden, _explicit(torch.ones_like(y))).values()
    else:
        out = model[1](torch.tanh(model[0](x))).reshape(-1)
    return (out - y.reshape(-1)).square().sum()


KINDS = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9, weight_decay=0.05)),
    ("sgd", dict(lr=0.1, momentum=0.8, nesterov=True)),
    ("adam", dict(lr=0.05, weight_decay=0.1)),
    ("adam", dict(lr=0.05, dense_above=0.1)),
    ("adamw", dict(lr=0.05, weight_decay=0.1)),
    ("adagrad", dict(lr=0.1, weight_decay=0.05, initial_accumulator_value=0.1)),
    ("rowwise_adagrad", dict(lr=0.1)),
    ("rowwise_adagrad", dict(lr=0.1, weight_decay=0.1)),
]

SHAPES = {"batch": (3,), "one row": (1,), "vector": (), "no rows": (0,)}


def _build(kind, hp, model):
    if kind == "fused_step":
        return noptim.fused_step_optimizer(model, **hp)
    return noptim.apply_optimizer_in_backward(model, kind, **hp)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind,hp", KINDS + [("fused_step", dict(lr=0.05, weight_decay=0.01))],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("sync_free", [False, True], ids=["rows", "masked"])
def test_dense_steps_equal_the_every_entry_sparse_steps(kind, hp, sparse_grad, shape,
                                                        sync_free, monkeypatch):
    """Step for step: parameters and optimiser state equal to the sparse batch and the
    pattern holding every entry (float64), on the CPU's row update and on the GPU's
    synchronisation-free step (its CPU proxy)."""
    if sync_free:
        monkeypatch.setattr(nnsparse._kernels, "_SYNC_FREE", ("cpu",))
    dense, sparse = _models(sparse_grad)
    opts = [_build(kind, hp, m) for m in (dense, sparse)]
    gen = torch.Generator().manual_seed(1)
    lead = SHAPES[shape]
    for step in range(3):
        x = torch.randn(lead + (IN,), generator=gen, dtype=torch.float64)
        if lead and lead[0] > 1:
            x[1] = 0  # an all-zero row: still specified, its rows stepped
        y = torch.randn(lead + (OUT,), generator=gen, dtype=torch.float64)
        for explicit, (model, opt) in enumerate(zip((dense, sparse), opts)):
            opt.zero_grad()
            _loss(model, x, y, bool(explicit)).backward()
            assert model[1].weight.grad is None  # stepped in the backward, no gradient
            assert (model[0].weight_t if sparse_grad else model[0].weight).grad is None
            opt.step()
        for (name, p), q in zip(dense.named_parameters(), sparse.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=f"{name} {step}")
    for name, table in opts[0].tables.items():
        for key, t in table.items():
            torch.testing.assert_close(t, opts[1].tables[name][key], rtol=1e-12, atol=1e-12,
                                       msg=f"{name}.{key}")


def test_leading_dimensions_step_as_their_rows():
    """A (2, 3, in) input steps as the (6, in) batch of its rows."""
    flat, lead = _models()
    opts = [noptim.apply_optimizer_in_backward(m, "adam", lr=0.05) for m in (flat, lead)]
    gen = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.randn(2, 3, IN, generator=gen, dtype=torch.float64)
        y = torch.randn(2, 3, OUT, generator=gen, dtype=torch.float64)
        for model, opt, (xs, ys) in ((flat, opts[0], (x.reshape(6, IN), y.reshape(6, OUT))),
                                     (lead, opts[1], (x, y))):
            opt.zero_grad()
            _loss(model, xs, ys, False).backward()
            opt.step()
    for p, q in zip(flat.parameters(), lead.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sizes", [(IN, 0, OUT), (0, HIDDEN, OUT), (IN, HIDDEN, 0)],
                         ids=["no hidden", "no inputs", "no outputs"])
def test_zero_widths_step_as_the_every_entry_sparse_batch(sizes):
    dense, sparse = _models(sizes=sizes)
    opts = [noptim.apply_optimizer_in_backward(m, "adam", lr=0.1) for m in (dense, sparse)]
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(3, sizes[0], generator=gen, dtype=torch.float64)
        y = torch.randn(3, sizes[2], generator=gen, dtype=torch.float64)
        for explicit, (model, opt) in enumerate(zip((dense, sparse), opts)):
            opt.zero_grad()
            _loss(model, x, y, bool(explicit)).backward()
            opt.step()
    for p, q in zip(dense.parameters(), sparse.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    for name, table in opts[0].tables.items():
        for key, t in table.items():
            torch.testing.assert_close(t, opts[1].tables[name][key], msg=f"{name}.{key}")


def test_input_gradient_reads_the_weight_before_the_step():
    """The input's gradient is nn.Linear's with the weight of the forward (read before the
    step), and the step is torch's SGD on the dense gradient."""
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(IN, OUT, dtype=torch.float64)
    reference = nn.Linear(IN, OUT, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    noptim.apply_optimizer_in_backward(layer, "sgd", lr=0.5)
    h = torch.randn(3, IN, dtype=torch.float64, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_()
    layer(h).pow(2).sum().backward()
    reference(h_ref).pow(2).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad)
    torch.testing.assert_close(layer.weight, reference.weight - 0.5 * reference.weight.grad)
    torch.testing.assert_close(layer.bias.grad, reference.bias.grad)


def test_autocast_steps_from_the_gradient_in_the_weight_s_dtype():
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(IN, OUT)
    reference = nn.Linear(IN, OUT)
    reference.load_state_dict(layer.state_dict())
    noptim.apply_optimizer_in_backward(layer, "sgd", lr=0.5)
    h = torch.randn(3, IN, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_()
    outs = []
    for module, x in ((layer, h), (reference, h_ref)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x)
        outs.append(out)
        out.float().pow(2).sum().backward()
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    assert h.grad.dtype == torch.float32 and layer.bias.grad.dtype == torch.float32
    torch.testing.assert_close(h.grad, h_ref.grad)
    torch.testing.assert_close(layer.bias.grad, reference.bias.grad)
    torch.testing.assert_close(layer.weight, reference.weight - 0.5 * reference.weight.grad)


# -- the in-backward mode's checks hold ---------------------------------------------------------

def _attached(sparse_grad=False):
    model, _ = _models(sparse_grad)
    return model, noptim.apply_optimizer_in_backward(model, "adam", lr=0.05)


def _data(rows=3):
    gen = torch.Generator().manual_seed(4)
    return (torch.randn(rows, IN, generator=gen, dtype=torch.float64),
            torch.randn(rows, OUT, generator=gen, dtype=torch.float64))


def test_a_layer_used_twice_is_refused_before_any_step():
    model, opt = _attached()
    (x, y), before = _data(), copy.deepcopy(model.state_dict())
    loss = _loss(model, x, y, False) + _loss(model, x, y, False)
    with pytest.raises(RuntimeError, match="this layer is used 2 times in the graph"):
        loss.backward()
    for name, t in model.state_dict().items():
        assert torch.equal(t, before[name]), name


def test_a_second_backward_of_the_graph_is_refused():
    model, opt = _attached()
    x, y = _data()
    loss = _loss(model, x, y, False)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="each forward is one optimiser step"):
        loss.backward()


def test_gradient_accumulation_is_refused():
    model, opt = _attached()
    x, y = _data()
    _loss(model, x, y, False).backward()
    with pytest.raises(RuntimeError, match="a second backward since the optimiser's last step"):
        _loss(model, x, y, False).backward()
    opt.zero_grad()
    _loss(model, x, y, False).backward()  # after zero_grad: a new step


def test_a_recorded_backward_that_would_step_is_refused():
    model, opt = _attached()
    x, y = _data()
    with pytest.raises(RuntimeError, match="create_graph=True"):
        _loss(model, x, y, False).backward(create_graph=True)


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_autograd_grad_of_the_weight_returns_it_and_steps_nothing(sparse_grad):
    model, opt = _attached(sparse_grad)
    reference = nn.Linear(HIDDEN, OUT, dtype=torch.float64)
    reference.load_state_dict(model[1].state_dict())
    x, y = _data()
    hidden = torch.tanh(model[0](x)).detach()
    weight, bias = model[1].weight.detach().clone(), model[1].bias.detach().clone()
    got = torch.autograd.grad((model[1](hidden) - y).square().sum(), [model[1].weight])
    want = torch.autograd.grad((reference(hidden) - y).square().sum(), [reference.weight])
    torch.testing.assert_close(got[0], want[0])
    gb = torch.autograd.grad((model[1](hidden) - y).square().sum(), [model[1].bias])
    assert gb[0].shape == (OUT,)
    assert torch.equal(model[1].weight, weight) and torch.equal(model[1].bias, bias)
    assert opt.tables  # (nothing stepped: the state is as built)
    for table in opt.tables.values():
        assert float(table["step"]) == 0


def test_no_grad_inference_is_unchanged():
    model, opt = _attached()
    x, _ = _data()
    with torch.no_grad():
        out = model[1](model[0](x))
    assert out.grad_fn is None and out.shape == (3, OUT)


@pytest.mark.skipif(not torch.distributed.is_available()
                    or not torch.distributed.is_gloo_available(), reason="no gloo backend")
def test_a_dense_input_inside_ddp_is_refused_at_the_forward():
    """As for a sparse batch: the in-backward step would use this process's gradient only."""
    import torch.distributed as dist
    model, opt = _attached()
    x, y = _data()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(model[0], nn.Tanh(), model[1]))
        with pytest.raises(NotImplementedError, match="runs inside DistributedDataParallel"):
            ddp(x)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_dense_model_steps_as_the_plain_one(reentrant):
    from torch.utils.checkpoint import checkpoint
    ours, ref = _models()
    opts = [noptim.apply_optimizer_in_backward(m, "adam", lr=0.1) for m in (ours, ref)]

    def run(model, x):
        return model[1](torch.tanh(model[0](x)))
    gen = torch.Generator().manual_seed(6)
    for _ in range(2):
        x = torch.randn(3, IN, generator=gen, dtype=torch.float64, requires_grad=True)
        y = torch.randn(3, OUT, generator=gen, dtype=torch.float64)
        for opt in opts:
            opt.zero_grad()
        (checkpoint(run, ours, x, use_reentrant=reentrant) - y).square().sum().backward()
        (run(ref, x) - y).square().sum().backward()
        for opt in opts:
            opt.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


# -- a SparseOutputLinear's weight is stepped in place as a contiguous table ---------------------

def _column_major(layer):
    with torch.no_grad():  # the same Parameter and values, stored transposed
        layer.weight.data = layer.weight.t().contiguous().t()
    assert not layer.weight.is_contiguous()


@pytest.mark.parametrize("pattern", [False, True], ids=["dense output", "pattern"])
@pytest.mark.parametrize("kind", ["adam", "adagrad", "sgd"])
def test_a_sparse_output_weight_not_contiguous_is_refused(kind, pattern):
    """Its rows are updated in place as a contiguous table: torch's fused CPU Adam and
    Adagrad stepped a strided weight wrong (each element from another's gradient), the
    pattern path as the dense one.  Refused at the training forward, nothing changed; the
    way round the message gives trains as a layer never changed."""
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(IN, OUT, dtype=torch.float64)
    reference = copy.deepcopy(layer)
    opts = [noptim.apply_optimizer_in_backward(m, kind, lr=0.1) for m in (layer, reference)]
    _column_major(layer)
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(3, IN, generator=gen, dtype=torch.float64)
    target = _explicit(torch.ones(3, OUT, dtype=torch.float64)) if pattern else None

    def loss(m):
        out = m(h, target)
        return (out.values() if pattern else out).square().sum()
    before = layer.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"needs it stored as the layer made it \(weight "
                                           r"contiguous.*layer\.weight\.data = "
                                           r"layer\.weight\.contiguous\(\)"):
        loss(layer)
    assert torch.equal(layer.weight, before) and layer.weight.grad is None
    with torch.no_grad():  # inference reads it as it is
        torch.testing.assert_close(layer(h, target), reference(h, target))
    param = layer.weight
    with torch.no_grad():  # the message's way round
        layer.weight.data = layer.weight.contiguous()
    assert layer.weight is param
    for _ in range(2):
        for m, opt in zip((layer, reference), opts):
            opt.zero_grad()
            loss(m).backward()
            opt.step()
    torch.testing.assert_close(layer.weight, reference.weight, rtol=1e-12, atol=1e-12)
    assert not torch.equal(layer.weight, before)


def test_attaching_to_a_sparse_output_weight_not_contiguous_names_the_way_round():
    layer = nnsparse.SparseOutputLinear(IN, OUT)
    layer.weight = nn.Parameter(torch.randn(IN, OUT).t())
    with pytest.raises(ValueError, match=r"\(weight contiguous.*layer\.weight\.data = "
                                         r"layer\.weight\.contiguous\(\)"):
        noptim.apply_optimizer_in_backward(layer, "adam")
    with torch.no_grad():
        layer.weight.data = layer.weight.contiguous()
    assert noptim.apply_optimizer_in_backward(layer, "adam") is not None


# -- the GPU's step: nothing read back, no copy of the table -------------------------------------

class _Ops(TorchDispatchMode):
    """The aten ops run, with their outputs' shapes."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        self.ops.append((str(func.overloadpacket), shape))
        return out


@pytest.mark.parametrize("kind,hp", [("adam", dict(lr=0.05)),
                                     ("sgd", dict(lr=0.1, momentum=0.9)),
                                     ("rowwise_adagrad", dict(lr=0.1, weight_decay=0.1))])
def test_the_every_row_step_copies_no_table_on_the_gpu_path(kind, hp, monkeypatch):
    """Every row is touched, as the host knows: the GPU's step (its CPU proxy) is the kernel
    over the table, with none of the synchronisation-free step's copies of the table and
    its state (which would restore no row), and the same values."""
    monkeypatch.setattr(nnsparse._kernels, "_SYNC_FREE", ("cpu",))
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(IN, OUT, dtype=torch.float64)
    opt = noptim.apply_optimizer_in_backward(layer, kind, **hp)
    h = torch.randn(3, IN, dtype=torch.float64)
    loss = layer(h).square().sum()
    ops = _Ops()
    with ops:
        loss.backward()
    copies = [op for op in ops.ops if op[0] in ("aten.clone", "aten.where")
              and op[1] == (OUT, IN)]
    assert copies == []
    assert [op for op in ops.ops if op[0] == "aten._local_scalar_dense"] == []
    assert float(opt.tables["SparseOutputLinear"]["step"]) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("kind", ["adam", "rowwise_adagrad"])
def test_the_dense_step_reads_nothing_back_on_cuda(kind):
    torch.manual_seed(0)
    model = nn.ModuleList([nnsparse.SparseLinearBatch(IN, HIDDEN, device="cuda"),
                           nnsparse.SparseOutputLinear(HIDDEN, OUT, device="cuda")])
    opt = noptim.apply_optimizer_in_backward(model, kind, lr=0.05)
    x = torch.randn(3, IN, device="cuda")

    def step():
        opt.zero_grad()
        model[1](torch.tanh(model[0](x))).square().sum().backward()
    step()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
