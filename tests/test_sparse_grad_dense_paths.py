"""The checks both ``sparse_grad=True`` dense paths share: ``SparseLinearBatch`` given a dense
(strided) input (parameter ``weight_t``, tests/test_sparse_grad_dense_input.py) and
``SparseOutputLinear`` called without a pattern (parameter ``weight``,
tests/test_sparse_grad_dense_output.py).  Each check runs for both layers; the checks of
one layer only stay in its own file.
"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnsparse


@dataclasses.dataclass(frozen=True)
class _Layer:
    """One ``sparse_grad`` layer on a dense input: its class, its weight's name and layout,
    and the input of the host-read check."""
    cls: type  # called (in_features, out_features, **kwargs)
    weight: str  # the weight parameter's name
    transposed: bool  # the weight is stored (in_features, out_features)
    host_read_shape: tuple  # the input of test_no_host_read_nor_nonzero

    def weight_grad(self, layer):
        """``layer``'s weight gradient, dense, laid out as ``nn.Linear``'s weight's."""
        grad = getattr(layer, self.weight).grad.to_dense()
        return grad.t() if self.transposed else grad


LAYERS = {
    "SparseLinearBatch": _Layer(nnsparse.SparseLinearBatch, "weight_t", True, (4, 6)),
    "SparseOutputLinear": _Layer(nnsparse.SparseOutputLinear, "weight", False, (2, 4, 6)),
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_no_host_read_nor_nonzero(kind, host_reads):
    """The gradients' indices are an arange of a shape: nothing is read back to the host
    (conftest's host_reads: every Python-level read refused) and no nonzero."""
    spec = LAYERS[kind]
    layer = spec.cls(6, 3, sparse_grad=True)
    x = torch.randn(spec.host_read_shape, requires_grad=True)
    with host_reads(nonzero=True):
        layer(x).sum().backward()
    assert getattr(layer, spec.weight).grad.layout == layer.bias.grad.layout == torch.sparse_coo


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("kind", list(LAYERS))
def test_no_sync_on_cuda(kind):
    spec = LAYERS[kind]
    layer = spec.cls(6, 3, sparse_grad=True, device="cuda")
    x = torch.randn(4, 6, device="cuda", requires_grad=True)
    layer(x).sum().backward()  # warm-up
    layer.zero_grad()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert getattr(layer, spec.weight).grad.layout == torch.sparse_coo


@pytest.mark.parametrize("kind, frozen", [(kind, frozen) for kind, spec in LAYERS.items()
                                          for frozen in (spec.weight, "bias", "both")])
def test_frozen_parameters(kind, frozen):
    spec = LAYERS[kind]
    layer = spec.cls(6, 3, sparse_grad=True)
    for name in (spec.weight, "bias") if frozen == "both" else (frozen,):
        getattr(layer, name).requires_grad_(False)
    x = torch.randn(2, 6, requires_grad=True)
    layer(x).sum().backward()
    for p in layer.parameters():
        assert (p.grad is None) == (not p.requires_grad)
        assert p.grad is None or p.grad.layout == torch.sparse_coo
    torch.testing.assert_close(x.grad, layer.weight.detach().sum(0).expand(2, 6))


@pytest.mark.parametrize("kind", list(LAYERS))
def test_no_grad_and_sparse_grad_false_are_unchanged(kind):
    cls = LAYERS[kind].cls
    torch.manual_seed(0)
    layer = cls(6, 3, sparse_grad=True)
    x = torch.randn(2, 6)
    with torch.no_grad():
        out = layer(x)
    assert out.grad_fn is None and torch.equal(out, F.linear(x, layer.weight, layer.bias))
    dense = cls(6, 3)
    dense(x).sum().backward()
    assert dense.weight.grad.layout == dense.bias.grad.layout == torch.strided


@pytest.mark.parametrize("kind", list(LAYERS))
def test_autocast_gives_sparse_gradients_in_the_parameters_dtype(kind):
    torch.manual_seed(0)
    layer = LAYERS[kind].cls(6, 3, sparse_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.randn(2, 6))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    for p in layer.parameters():
        assert p.grad.layout == torch.sparse_coo and p.grad.dtype == torch.float32


@pytest.mark.parametrize("kind", list(LAYERS))
def test_double_backward_through_the_dense_input(kind):
    """A gradient penalty on the input's gradient: the weight's second-order gradient is
    sparse too, and equal to nn.Linear's."""
    spec = LAYERS[kind]
    torch.manual_seed(0)
    layer = spec.cls(5, 3, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(5, 3, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    for module in (layer, reference):
        out = torch.tanh(module(x))
        gx, = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.pow(2).sum() + gx.pow(2).sum()).backward()
    assert getattr(layer, spec.weight).grad.layout == torch.sparse_coo
    torch.testing.assert_close(spec.weight_grad(layer), reference.weight.grad)
    torch.testing.assert_close(layer.bias.grad.to_dense(), reference.bias.grad)


@pytest.mark.skipif(not torch.distributed.is_available()
                    or not torch.distributed.is_gloo_available(), reason="no gloo backend")
@pytest.mark.parametrize("kind", list(LAYERS))
def test_distributed_data_parallel_takes_the_dense_path_s_sparse_gradients(kind):
    """nnsparse's DDP declares a sparse_grad layer's parameters sparse: a dense hidden input
    to it, without a pattern for SparseOutputLinear (F.linear's dense gradients raised
    "Expected variable to have sparse gradient"), now all-reduces as a sparse batch's or a
    pattern's (gloo, a group of one process)."""
    import torch.distributed as dist
    import nnsparse.distributed as nd
    spec = LAYERS[kind]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), spec.cls(4, 6, sparse_grad=True))
    reference = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 6))
    reference.load_state_dict(model.state_dict())
    x = torch.randn(5, 6)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        nd.wrap(model)(x).pow(2).sum().backward()
    finally:
        dist.destroy_process_group()
    reference(x).pow(2).sum().backward()
    decoder = model[2]
    assert getattr(decoder, spec.weight).grad.layout == decoder.bias.grad.layout == (
        torch.sparse_coo)
    torch.testing.assert_close(spec.weight_grad(decoder), reference[2].weight.grad)
    torch.testing.assert_close(decoder.bias.grad.to_dense(), reference[2].bias.grad)
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad)
