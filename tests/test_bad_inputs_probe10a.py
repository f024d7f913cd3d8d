"""The tenth bad-input probe, layers side (docs/bad_inputs_probe10a.md): module-level
operations a PyTorch user does on nnsparse's layers (``+`` / ``*`` of containers,
``torch.nn.utils.parametrize`` on the weights, state dicts of parametrized layers) and
``SparseParts.to``'s arguments.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result, against a dense reference where there is one).
"""
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from probe_cases import Case, run_case
import nnsparse
from nnsparse import PatternSequential, SparseLinearBatch, SparseOutputLinear, sparse_parts



def _x() -> torch.Tensor:
    return torch.tensor([[1., 0., 2., 0.], [0., 3., 0., 0.], [0., 0., 0., 4.]])


# -- PatternSequential's + and * -------------------------------------------------------------

def _encoder_decoder():
    torch.manual_seed(0)
    return (PatternSequential(SparseLinearBatch(4, 3), nn.Tanh()),
            PatternSequential(SparseOutputLinear(3, 4)))


def _added():
    """``(a + b)(x, x)`` against ``b(a(x), x)``: + keeps the pattern path."""
    a, b = _encoder_decoder()
    x = _x().to_sparse()
    both = a + b
    out, ref = both(x, x), b(a(x), x)
    return type(both), out.to_dense(), ref.to_dense()


class _Masked(nn.Module):
    """A user module that takes the pattern: keeps the input at its entries."""

    def forward(self, x: torch.Tensor, pattern: Any = None) -> torch.Tensor:
        return x if pattern is None else x * (pattern.to_dense() != 0)


def _multiplied(left: bool):
    """``n * s`` and ``s * n``: the pattern reaches both copies of the pattern module."""
    torch.manual_seed(0)
    linear, masked = nn.Linear(4, 4), _Masked()
    s = PatternSequential(linear, masked)
    x, pattern = _x(), _x().to_sparse()
    twice = 2 * s if left else s * 2
    out = twice(x, pattern)
    ref = masked(linear(masked(linear(x), pattern)), pattern)
    return type(twice), len(twice), out, ref


SEQUENTIAL_CASES = [
    Case("pattern-sequential-add-keeps-class", _added, None,
         check=lambda r: r[0] is PatternSequential and torch.allclose(r[1], r[2])),
    Case("pattern-sequential-mul-keeps-class", lambda: _multiplied(False), None,
         check=lambda r: r[0] is PatternSequential and r[1] == 4 and torch.allclose(r[2], r[3])),
    Case("pattern-sequential-rmul-keeps-class", lambda: _multiplied(True), None,
         check=lambda r: r[0] is PatternSequential and r[1] == 4 and torch.allclose(r[2], r[3])),
    Case("pattern-sequential-add-plain-sequential", lambda: type(
        PatternSequential(nn.Tanh()) + nn.Sequential(nn.ReLU())), None,
         check=lambda r: r is PatternSequential),
    Case("pattern-sequential-mul-zero", lambda: PatternSequential(nn.Tanh()) * 0, ValueError,
         "Non-positive multiplication factor 0"),
    Case("pattern-sequential-add-not-sequential", lambda: PatternSequential(nn.Tanh()) + 3,
         ValueError, "add operator supports only objects of Sequential class"),
]


# -- torch.nn.utils.parametrize on SparseLinearBatch(sparse_grad=True)'s weight_t ---------------

def _weight_normed(sparse_grad: bool = True) -> SparseLinearBatch:
    torch.manual_seed(0)
    layer = nn.utils.parametrizations.weight_norm(SparseLinearBatch(4, 3, sparse_grad=True),
                                                  name="weight_t")
    layer.sparse_grad = sparse_grad
    return layer


def _parametrized_dense_grads(sparse_grad: bool = False):
    """Output and gradients of the originals against F.linear on the dense batch (with
    ``sparse_grad``: dense gradients too, a parametrization's backward takes no sparse one)."""
    layer = _weight_normed(sparse_grad=sparse_grad)
    x = _x()
    out = layer(x.to_sparse())
    out.sum().backward()
    got = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    ref = F.linear(x, layer.weight, layer.bias)
    ref.sum().backward()
    want = [p.grad for p in layer.parameters()]
    return out, ref, got, want


def _parametrized_state_round_trip():
    source, target = _weight_normed(False), _weight_normed(False)
    with torch.no_grad():
        target.parametrizations.weight_t.original1.mul_(2)
    keys = sorted(source.state_dict())
    target.load_state_dict(source.state_dict())
    x = _x().to_sparse()
    return keys, torch.equal(source(x), target(x))


def _double_weight() -> SparseLinearBatch:
    class Double(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    layer = SparseLinearBatch(4, 3, sparse_grad=True)
    parametrize.register_parametrization(layer, "weight_t", Double())
    return layer


def _double_weight_trains() -> torch.Tensor:
    """The gradient of a custom parametrization's original (2 * w) from a sparse batch."""
    layer = _double_weight()
    layer(_x().to_sparse()).sum().backward()
    return layer.parametrizations.weight_t.original.grad


def _output_weight_normed(sparse_grad: bool = True) -> SparseOutputLinear:
    torch.manual_seed(0)
    layer = nn.utils.parametrizations.weight_norm(SparseOutputLinear(5, 4, sparse_grad=True))
    layer.sparse_grad = sparse_grad
    return layer


def _output_parametrized(context: str):
    """SparseOutputLinear with a weight-normed weight: its output (and, trained with
    sparse_grad=False, its gradients) against the dense masked reference."""
    layer = _output_weight_normed(sparse_grad=context != "dense-grads")
    h, x = torch.randn(3, 5), _x()
    mask = x != 0
    if context == "no_grad":
        with torch.no_grad():
            return layer(h, x.to_sparse()).to_dense(), F.linear(h, layer.weight, layer.bias) * mask
    out = layer(h, x.to_sparse())
    out.values().sum().backward()
    got = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    (F.linear(h, layer.weight, layer.bias) * mask).sum().backward()
    want = [p.grad for p in layer.parameters()]
    return (out.to_dense(), (F.linear(h, layer.weight, layer.bias) * mask).detach(), got, want)


def _no_grad_forward(layer: nn.Module, *args: Any):
    with torch.no_grad():
        return layer(*args)


PARAMETRIZE_CASES = [
    # a training call of a sparse_grad=True layer on a sparse batch (refused before): the
    # parametrization's originals get the dense reference's gradients
    Case("sparse-grad-parametrized-weight-t-trains", lambda: _parametrized_dense_grads(True), None,
         check=lambda r: torch.allclose(r[0], r[1]) and len(r[2]) == 3
         and all(a.layout == torch.strided and torch.allclose(a, b) for a, b in zip(r[2], r[3]))),
    Case("sparse-grad-parametrized-weight-t-no-grad",
         lambda: (_no_grad_forward(_weight_normed(), _x().to_sparse()), _weight_normed()), None,
         check=lambda r: torch.allclose(r[0], F.linear(_x(), r[1].weight, r[1].bias))),
    Case("sparse-grad-parametrized-weight-t-dense-input",
         lambda: (_weight_normed()(_x()), _weight_normed()), None,
         check=lambda r: torch.allclose(r[0], F.linear(_x(), r[1].weight, r[1].bias))),
    Case("sparse-grad-output-parametrized-weight-trains",
         lambda: _output_parametrized("sparse-grad"), None,
         check=lambda r: torch.allclose(r[0], r[1]) and len(r[2]) == 3
         and all(a.layout == torch.strided and torch.allclose(a, b) for a, b in zip(r[2], r[3]))),
    Case("sparse-grad-output-parametrized-weight-no-grad",
         lambda: _output_parametrized("no_grad"), None,
         check=lambda r: torch.allclose(r[0], r[1])),
    Case("output-parametrized-weight-dense-grads", lambda: _output_parametrized("dense-grads"),
         None, check=lambda r: torch.allclose(r[0], r[1]) and len(r[2]) == 3
         and all(torch.allclose(a, b) for a, b in zip(r[2], r[3]))),
    Case("sparse-grad-parametrized-custom-trains", _double_weight_trains, None,
         check=lambda g: g.layout == torch.strided and torch.allclose(
             g, 2 * _x().t() @ torch.ones(_x().shape[0], 3))),
    Case("parametrized-weight-t-weight-view", lambda: _weight_normed().weight, None,
         check=lambda w: tuple(w.shape) == (3, 4)),
    Case("parametrized-weight-t-state-dict", _parametrized_state_round_trip, None,
         check=lambda r: r[0] == ["bias", "parametrizations.weight_t.original0",
                                  "parametrizations.weight_t.original1"] and r[1]),
    Case("parametrized-weight-t-dense-grads-match-reference", _parametrized_dense_grads, None,
         check=lambda r: torch.allclose(r[0], r[1]) and len(r[2]) == 3
         and all(torch.allclose(a, b) for a, b in zip(r[2], r[3]))),
]


# -- SparseWeightLinear after nn.Module.to_empty ------------------------------------------------

def _emptied(load: bool):
    """A SparseWeightLinear after ``to_empty`` (buffers uninitialised: zeros here, what fresh
    memory holds), then ``reset_parameters`` (values only), and its forward; with ``load``,
    the saved state of the original loaded first (the meta-device initialisation flow)."""
    torch.manual_seed(0)
    source = nnsparse.SparseWeightLinear.random(4, 3, 0.5, seed=0)
    layer = nnsparse.SparseWeightLinear.random(4, 3, 0.5, seed=1)
    layer.to_empty(device="cpu")
    with torch.no_grad():
        layer.crow.zero_()
        layer.col.zero_()
    if load:
        layer.load_state_dict(source.state_dict())
    else:
        layer.reset_parameters()
    x = _x()
    return layer(x), F.linear(x, source.weight.to_dense(), source.bias)


EMPTY_CASES = [
    Case("sparse-weight-to-empty-names-the-pattern", lambda: _emptied(False), ValueError,
         r"SparseWeightLinear crow/col .*left uninitialised by to_empty\(\).*load a state_dict"),
    Case("sparse-weight-to-empty-then-load", lambda: _emptied(True), None,
         check=lambda r: torch.allclose(r[0], r[1])),
]


# -- settings assigned after construction (checked at the call, as the constructor checks) ------

def _assigned(make: Callable[[], Any], name: str, value: Any, call: Callable[[Any], Any]):
    obj = make()
    setattr(obj, name, value)
    return call(obj)


def _batchifier():
    torch.manual_seed(0)
    return nnsparse.Batchifier(nn.Sequential(nnsparse.Densify(4), nn.Linear(4, 2)),
                               output_size=2, batch_size=2, progress=False)


_DENSIFY = lambda: nnsparse.Densify(4)  # noqa: E731
_RUN = lambda b: b(_x().to_sparse())  # noqa: E731
_TOPK = lambda b: b.topk(_x().to_sparse(), k=1)  # noqa: E731

ASSIGNED_CASES = [
    Case("densify-in-features-str", lambda: _assigned(_DENSIFY, "in_features", "4",
                                                       lambda d: d(_x().to_sparse())),
         TypeError, r"in_features must be a non-negative int, got str '4'"),
    Case("densify-in-features-negative", lambda: _assigned(_DENSIFY, "in_features", -1,
                                                            lambda d: d(_x().to_sparse())),
         ValueError, r"in_features must be a non-negative int, got -1"),
    Case("densify-elem-str", lambda: _assigned(_DENSIFY, "elem", "a",
                                                lambda d: d(_x().to_sparse())),
         TypeError, r"elem must be a number, got str 'a'"),
    Case("densify-in-features-wider-assigned", lambda: _assigned(_DENSIFY, "in_features", 6,
                                                                  lambda d: d(_x().to_sparse())),
         None, check=lambda y: torch.equal(y, F.pad(_x(), (0, 2)))),
    Case("batchifier-network-none", lambda: _assigned(_batchifier, "network", None, _RUN),
         TypeError, r"network must be an nn\.Module, got NoneType"),
    Case("batchifier-network-none-topk", lambda: _assigned(_batchifier, "network", None, _TOPK),
         TypeError, r"network must be an nn\.Module, got NoneType"),
    Case("batchifier-output-size-str", lambda: _assigned(_batchifier, "output_size", "2", _RUN),
         TypeError, r"output_size must be an int >= 0, got '2'"),
    Case("batchifier-layout-csc", lambda: _assigned(_batchifier, "layout", torch.sparse_csc,
                                                     _RUN),
         TypeError, r"layout must be torch\.sparse_csr or torch\.sparse_coo, got "
         r"torch\.sparse_csc"),
    Case("batchifier-layout-coo-assigned", lambda: (
        _assigned(_batchifier, "layout", torch.sparse_coo, _RUN), _batchifier().network[1]),
         None, check=lambda r: torch.allclose(r[0], r[1](_x()).detach())),
]


# -- SparseParts.to ----------------------------------------------------------------------------

def _sparse_grad_parts(layer_kind: str, context: str):
    """A sparse_grad=True layer on SparseParts under ``context`` against the eager batch."""
    torch.manual_seed(0)
    x = _x().to_sparse()
    parts = sparse_parts(x)
    if layer_kind == "linear":
        layer: nn.Module = SparseLinearBatch(4, 3, sparse_grad=True)
        call = lambda inp: layer(inp)  # noqa: E731
    else:
        layer = SparseOutputLinear(5, 4, sparse_grad=True)
        h = torch.randn(3, 5)
        call = lambda inp: layer(h, inp)  # noqa: E731
    want = call(x)
    if context == "frozen":
        layer.requires_grad_(False)
        got = call(parts)
    else:
        with (torch.no_grad() if context == "no_grad" else torch.inference_mode()):
            got = call(parts)
    got = got if isinstance(got, torch.Tensor) else got.to_sparse_csr()
    return got.to_dense(), want.detach().to_dense()


PARTS_CASES = [
    Case("sparse-grad-parts-linear-no-grad", lambda: _sparse_grad_parts("linear", "no_grad"),
         None, check=lambda r: torch.allclose(r[0], r[1])),
    Case("sparse-grad-parts-linear-inference-mode",
         lambda: _sparse_grad_parts("linear", "inference"), None,
         check=lambda r: torch.allclose(r[0], r[1])),
    Case("sparse-grad-parts-linear-frozen", lambda: _sparse_grad_parts("linear", "frozen"),
         None, check=lambda r: torch.allclose(r[0], r[1])),
    Case("sparse-grad-parts-output-no-grad", lambda: _sparse_grad_parts("output", "no_grad"),
         None, check=lambda r: torch.allclose(r[0], r[1])),
    Case("sparse-grad-parts-output-frozen", lambda: _sparse_grad_parts("output", "frozen"),
         None, check=lambda r: torch.allclose(r[0], r[1])),
    Case("sparse-grad-parts-linear-training-still-refused",
         lambda: SparseLinearBatch(4, 3, sparse_grad=True)(sparse_parts(_x().to_sparse())),
         NotImplementedError, r"SparseParts input \(torch.compile\) in training: .*"
         r"under torch\.no_grad\(\), or with the weight and bias frozen, it runs"),
    Case("sparse-grad-parts-output-training-still-refused",
         lambda: SparseOutputLinear(5, 4, sparse_grad=True)(torch.randn(3, 5),
                                                            sparse_parts(_x().to_sparse())),
         NotImplementedError, r"SparseParts pattern \(torch.compile\) in training"),

    Case("parts-to-dtype", lambda: sparse_parts(_x().to_sparse()).to(torch.float64), TypeError,
         r"device must be .*got the dtype torch\.float64.*"
         r"with_values\(parts\.values\.to\(torch\.float64\)\)"),
    Case("parts-to-device-still-works", lambda: sparse_parts(_x().to_sparse()).to("cpu"), None,
         check=lambda p: torch.equal(p.to_sparse_csr().to_dense(), _x())),
]



@pytest.mark.parametrize("case", SEQUENTIAL_CASES + PARAMETRIZE_CASES + EMPTY_CASES + ASSIGNED_CASES + PARTS_CASES,
                         ids=lambda c: c.id)
def test_probe10a(case: Case) -> None:
    run_case(case)


def test_probe10a_module_ids_are_unique() -> None:
    ids = [c.id for c in SEQUENTIAL_CASES + PARAMETRIZE_CASES + EMPTY_CASES + ASSIGNED_CASES + PARTS_CASES]
    assert len(ids) == len(set(ids))
