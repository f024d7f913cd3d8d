"""Automatic mixed precision (torch.autocast) through every layer and criterion.

Policy (docs/compile_amp.md): the sparse products run in float32 under
autocast (as torch's own ``embedding_bag`` and sparse kernels do); dense
GEMMs (``mode="dense"``, a decoder with no pattern) follow autocast like
``nn.Linear``; every criterion computes in float32.  Each case is compared
with the float32 computation on the same numbers.
"""
import copy

import pytest
import torch
from torch import nn

import nnsparse
from tests.matrix import CUDA, random_sparse_dense

# (device, autocast dtype); the CUDA ones skip without a GPU.
AMP = [pytest.param("cpu", torch.bfloat16, id="cpu-bf16")] + [
    pytest.param("cuda", dt, id=f"cuda-{name}",
                 marks=pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine"))
    for dt, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"))]
# bfloat16 keeps 8 bits of mantissa: about 2 significant digits.
LOW = dict(rtol=3e-2, atol=3e-2)
WIDTH, HIDDEN = 30, 6


def _x(device, rows=5, density=0.4, seed=0):
    dense = random_sparse_dense(rows, WIDTH, density, dtype=torch.float32,
                                generator=torch.Generator().manual_seed(seed), empty_rows=1)
    return dense.to(device).to_sparse_csr()


def _values(out):
    return out.values() if out.layout == torch.sparse_csr else out.coalesce().values()


@pytest.mark.parametrize("device, dtype", AMP)
@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_sparse_linear_batch(device, dtype, mode):
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, mode=mode).to(device)
    x = _x(device)
    want = layer(x)
    with torch.autocast(device, dtype=dtype):
        got = layer(x)
        parts = layer(nnsparse.sparse_parts(x))
    # the sparse kernels stay float32; the dense GEMM follows autocast, as nn.Linear
    assert got.dtype == (dtype if mode == "dense" else torch.float32)
    assert parts.dtype == (dtype if mode == "dense" else torch.float32)
    torch.testing.assert_close(got.float(), want, **LOW)
    torch.testing.assert_close(parts.float(), want, **LOW)


@pytest.mark.parametrize("device, dtype", AMP)
def test_sparse_output_linear(device, dtype):
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(HIDDEN, WIDTH).to(device)
    h, x = torch.randn(5, HIDDEN, device=device), _x(device)
    want = _values(layer(h, x))
    with torch.autocast(device, dtype=dtype):
        low_h = h.to(dtype)  # what an autocast GEMM before the decoder gives
        got = layer(low_h, x)
        parts = layer(low_h, nnsparse.sparse_parts(x))
        dense = layer(h)  # no pattern: nn.Linear under autocast
    assert _values(got).dtype == parts.values.dtype == torch.float32
    assert dense.dtype == dtype
    torch.testing.assert_close(_values(got), want, **LOW)
    torch.testing.assert_close(parts.values, want, **LOW)
    torch.testing.assert_close(dense.float(), layer(h), **LOW)


@pytest.mark.parametrize("device, dtype", AMP)
def test_sparse_output_linear_dense_output_of_a_low_precision_input(device, dtype):
    # a decoder with no pattern after an autocast GEMM (nn.Linear gives bf16/fp16):
    # F.linear under autocast takes the mixed dtypes, as nn.Linear does
    torch.manual_seed(0)
    encoder, layer = nn.Linear(WIDTH, HIDDEN).to(device), nnsparse.SparseOutputLinear(
        HIDDEN, WIDTH).to(device)
    x = torch.randn(5, WIDTH, device=device)
    with torch.autocast(device, dtype=dtype):
        h = encoder(x)
        assert h.dtype == dtype
        got = layer(h)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), layer(encoder(x)), **LOW)


@pytest.mark.parametrize("device, dtype", AMP)
def test_densify_sparsify(device, dtype):
    x = _x(device)
    with torch.autocast(device, dtype=dtype):
        dense = nnsparse.Densify(WIDTH)(x)
        back = nnsparse.Sparsify()(dense)
        low = nnsparse.Densify(WIDTH)(x.to(dtype))
    assert dense.dtype == torch.float32 and low.dtype == dtype  # dtype-preserving
    torch.testing.assert_close(nnsparse.densify(back), dense)
    torch.testing.assert_close(low.float(), dense, **LOW)


@pytest.mark.parametrize("device, dtype", AMP)
def test_low_precision_sparse_input(device, dtype):
    """A sparse batch in the autocast dtype (Sparsify of an autocast GEMM) is read in float32."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, mode="sparse").to(device)
    x = _x(device)
    with torch.autocast(device, dtype=dtype):
        got = layer(x.to(dtype))
        parts = layer(nnsparse.sparse_parts(x.to(dtype)))
    assert got.dtype == parts.dtype == torch.float32
    want = layer(nnsparse.densify(x).to(dtype).float().to_sparse_csr())
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(parts, want)


def _criteria(device):
    gen = lambda: torch.Generator(device=device).manual_seed(0)  # noqa: E731
    return {
        "SparseCriterion": nnsparse.SparseCriterion(nn.MSELoss()),
        "SDAECriterion": nnsparse.SDAECriterion(nn.MSELoss(), alpha=1.0, beta=0.5,
                                                hide_ratio=0.3, generator=gen()),
        "SDAESparseCriterion": nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5,
                                                            hide_ratio=0.3, generator=gen()),
        "MaskCriterion": nnsparse.MaskCriterion(nn.MSELoss(), alpha=1.0, beta=0.5,
                                                hide_ratio=0.3, generator=gen()),
    }


@pytest.mark.parametrize("device, dtype", AMP)
@pytest.mark.parametrize("name, estimate", [
    ("SparseCriterion", "dense"), ("SparseCriterion", "sparse"), ("SDAECriterion", "dense"),
    ("SDAESparseCriterion", "dense"), ("SDAESparseCriterion", "sparse"),
    ("MaskCriterion", "dense"), ("MaskCriterion", "sparse")])
def test_criteria_compute_in_float32(device, dtype, name, estimate):
    """A low-precision estimate gives a float32 loss equal to the float32 computation."""
    x = _x(device)
    crit = _criteria(device)[name]
    if name == "SDAECriterion" or (name == "MaskCriterion" and estimate == "dense"):
        source = nnsparse.densify(x)  # the dense-input forms of these two criteria
    else:
        source = x
    crit.prepare_input(source)
    dense_est = torch.randn(5, WIDTH, device=device).to(dtype).requires_grad_()
    index = x.to_sparse_coo().coalesce().indices()

    def as_estimate(e):  # the estimate at the target's entries, or dense
        if estimate == "dense":
            return e
        return torch.sparse_coo_tensor(index, e[index[0], index[1]], e.shape, is_coalesced=True)

    with torch.autocast(device, dtype=dtype):
        loss = crit(as_estimate(dense_est), source)
    assert loss.dtype == torch.float32
    ref_est = dense_est.detach().float().requires_grad_()
    ref = crit(as_estimate(ref_est), source)
    torch.testing.assert_close(loss, ref)
    loss.backward(), ref.backward()
    assert dense_est.grad.dtype == dtype
    torch.testing.assert_close(dense_est.grad.float(), ref_est.grad, **LOW)


class Autoencoder(nn.Module):
    """The main example's model (examples/movielens_autoencoder.py)."""

    def __init__(self, mode="auto"):
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, mode=mode)
        self.decoder = nnsparse.SparseOutputLinear(HIDDEN, WIDTH)

    def forward(self, x, pattern):
        out = self.decoder(torch.tanh(self.encoder(x)), pattern)
        if isinstance(out, nnsparse.SparseParts):
            return out.with_values(torch.tanh(out.values))
        return nnsparse.values_map(torch.tanh, out)


def _train(model, device, dtype, steps=3, scaler=None, compiled=None):
    """A few Adam steps with SDAESparseCriterion; returns the losses."""
    crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
                                        generator=torch.Generator(device=device).manual_seed(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        x = _x(device, rows=8, seed=step)
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            noisy = crit.prepare_input(x)
            if compiled is None:
                out = model(noisy, x)
            else:
                out = compiled(nnsparse.sparse_parts(noisy), nnsparse.sparse_parts(x))
                out = out.to_sparse_csr()
            loss = crit(out, x)
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("device, dtype", AMP)
@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_training_steps_match_float32(device, dtype, mode):
    torch.manual_seed(0)
    model = Autoencoder(mode).to(device)
    low = copy.deepcopy(model)
    want = _train(model, device, None)
    scaler = torch.amp.GradScaler(device) if device == "cuda" and dtype == torch.float16 else None
    got = _train(low, device, dtype, scaler=scaler)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **LOW)
    for a, b in zip(low.parameters(), model.parameters()):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, **LOW)


@pytest.mark.parametrize("device, dtype", AMP)
def test_compiled_under_autocast(device, dtype):
    """The compiled model (custom operators, autocast registered) under autocast."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Autoencoder("dense").to(device)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="aot_eager", fullgraph=True)
    want = _train(model, device, dtype)
    got = _train(twin, device, dtype, compiled=compiled)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **LOW)
    torch._dynamo.reset()


def test_autocast_casts_keep_a_batch_checked_once():
    # the autocast cast of a half sparse batch must not re-validate it every step
    from nnsparse._forms import _counts, _reset_counts
    layer = nnsparse.SparseLinearBatch(6, 3)
    for x in (nnsparse.sparsify(torch.tensor([[1., 0, 0, 2, 0, 0]]).bfloat16()),
              torch.tensor([[1., 0, 0, 2, 0, 0]]).bfloat16().to_sparse_csr()):
        _reset_counts()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(3):
                layer(x)
        assert _counts().get("validate", 0) <= 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_gives_input_values_their_gradient(dtype):
    torch.manual_seed(0)
    low = nnsparse.SparseLinearBatch(6, 3, dtype=dtype)
    ref = nnsparse.SparseLinearBatch(6, 3)
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    x = torch.tensor([[1., 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 1]]).to_sparse()
    x_low, x_ref = x.to(dtype).requires_grad_(), x.clone().requires_grad_()
    low(x_low).float().sum().backward()
    ref(x_ref).sum().backward()
    torch.testing.assert_close(x_low.grad.to_dense().float(), x_ref.grad.to_dense(),
                               rtol=1e-2, atol=1e-2)
