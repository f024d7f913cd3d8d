"""PatternSequential against nn.Sequential and the modules called by hand."""
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import PatternSequential

from matrix import make_form, random_sparse_dense

ROWS, WIDTH, HIDDEN = 5, 7, 3


def _model(seed: int = 0) -> PatternSequential:
    torch.manual_seed(seed)
    return PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), nn.Tanh(),
                             nnsparse.SparseOutputLinear(HIDDEN, WIDTH),
                             nnsparse.ValuesMap(torch.tanh))


class _Scaled(nn.Module):
    """A user module taking the pattern: doubles the values when it gets one."""

    def forward(self, x, pattern=None):
        if pattern is None:
            return x
        return nnsparse.values_map(lambda v: v * 2, x)


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr"])
def test_pattern_reaches_the_decoder(form):
    dense = random_sparse_dense(ROWS, WIDTH, 0.4, dtype=torch.float32, empty_rows=1)
    x = make_form(dense, form)
    model = _model()
    enc, _, dec, _ = model
    expected = nnsparse.values_map(torch.tanh, dec(torch.tanh(enc(x)), x))
    out = model(x, x)
    assert out.layout == expected.layout
    torch.testing.assert_close(out.to_dense(), expected.to_dense())
    out.values().sum().backward()
    assert enc.weight.grad is not None and dec.weight.grad is not None


def test_without_pattern_is_sequential():
    x = make_form(random_sparse_dense(ROWS, WIDTH, 0.4, dtype=torch.float32), "coo")
    model = _model()
    plain = nn.Sequential(*model)
    torch.testing.assert_close(model(x), plain(x))
    assert model(x).shape == (ROWS, WIDTH)


def test_state_dict_is_sequentials():
    model = _model(0)
    plain = nn.Sequential(*_model(1))
    plain.load_state_dict(model.state_dict())
    assert list(model.state_dict()) == list(plain.state_dict())
    assert isinstance(model[1:], PatternSequential)


def test_nested_and_user_modules_get_the_pattern():
    x = make_form(random_sparse_dense(ROWS, WIDTH, 0.4, dtype=torch.float32), "coo")
    torch.manual_seed(0)
    inner = PatternSequential(nnsparse.SparseOutputLinear(HIDDEN, WIDTH), _Scaled())
    outer = PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), inner)
    h = outer[0](x)
    expected = inner[0](h, x).coalesce().values() * 2
    torch.testing.assert_close(outer(x, x).coalesce().values(), expected)


def _half_case(sparse_grad: bool):
    torch.manual_seed(0)
    model = PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN, sparse_grad=sparse_grad),
                              nn.Tanh(),
                              nnsparse.SparseOutputLinear(HIDDEN, WIDTH, sparse_grad=sparse_grad))
    x = random_sparse_dense(ROWS, WIDTH, 0.4, dtype=torch.float32, empty_rows=1).to_sparse()
    return model, x


def test_half_on_cpu_matches_float32():
    model, x = _half_case(sparse_grad=False)
    reference = model(x, x).to_dense()
    half = model.half()
    out = half(x.half(), x.half())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.to_dense().float(), reference, rtol=1e-2, atol=2e-3)
    out.values().float().pow(2).sum().backward()
    assert all(p.grad.dtype == torch.float16 and p.grad.isfinite().all() for p in half.parameters())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_cpu_with_sparse_gradients(dtype):
    model, x = _half_case(sparse_grad=True)
    reference = model(x, x)
    reference.values().pow(2).sum().backward()
    expected = {n: p.grad.to_dense() for n, p in model.named_parameters()}
    low = model.to(dtype)
    low.zero_grad(set_to_none=True)
    out = low(x.to(dtype), x.to(dtype))
    assert out.dtype == dtype
    torch.testing.assert_close(out.to_dense().float(), reference.to_dense().detach(),
                               rtol=2e-2, atol=2e-2)
    out.values().float().pow(2).sum().backward()
    for name, p in low.named_parameters():
        assert p.grad.dtype == dtype
        torch.testing.assert_close(p.grad.to_dense().float(), expected[name], rtol=5e-2, atol=5e-2)
