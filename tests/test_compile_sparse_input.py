"""torch.compile of nnsparse modules, criteria and models fed torch sparse tensors.

Each nnsparse forward given a sparse form dynamo cannot fake (a CSR or COO tensor, a list
of rows) runs eagerly behind ``torch.compiler.disable`` (``nnsparse._forms.compile_boundary``):
a graph break at the nnsparse module, the dense modules around it compiled.  These tests
check that the compiled run equals the eager one, output and every parameter gradient,
for each module or criterion, sparse form and backend; ``tests/test_compile.py`` covers the
``SparseParts`` path, which compiles the nnsparse layers too, without a break.
"""
import copy
import os
import shutil
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import pytest
import torch
import torch._dynamo.testing
from torch import Tensor, nn

import nnsparse
from nnsparse.data import synthetic_ratings
from nnsparse.models import AutoRec
from tests.matrix import make_form, random_sparse_dense

WIDTH, HIDDEN, ROWS = 12, 5, 6
BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _dense(seed: int = 0) -> Tensor:
    return random_sparse_dense(ROWS, WIDTH, 0.4, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(seed), empty_rows=1)


def _values(out: Any) -> Tensor:
    """The numbers of an output, dense or sparse, in one comparable dense tensor."""
    if isinstance(out, Tensor) and out.layout != torch.strided:
        return out.to_dense()
    return out


class _Pattern(nn.Module):
    """A user's autoencoder: nnsparse layers and dense modules, the pattern passed on."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(WIDTH, HIDDEN)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.decoder = nnsparse.SparseOutputLinear(HIDDEN, WIDTH)

    def forward(self, x: Any, pattern: Any) -> Any:
        return self.decoder(torch.tanh(self.mid(torch.relu(self.encoder(x)))), pattern)


class _Loss(nn.Module):
    """A user's training step: model and criterion in one compiled module."""

    def __init__(self, model: nn.Module, criterion: nn.Module, pattern: bool = False) -> None:
        super().__init__()
        self.model, self.criterion, self.pattern = model, criterion, pattern

    def forward(self, x: Any, target: Any) -> Tensor:
        out = self.model(x, target) if self.pattern else self.model(x)
        return self.criterion(out, target)


class Case(NamedTuple):
    build: Callable[[], nn.Module]
    call: Callable[[nn.Module, Any], Any]  # (module, the sparse batch) -> output


def _sequential() -> nn.Module:
    return nn.Sequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, WIDTH))


def _weight_pattern() -> Tensor:
    return random_sparse_dense(HIDDEN, WIDTH, 0.5, generator=torch.Generator().manual_seed(5))


CASES: Dict[str, Case] = {
    # the issue's model: a plain nn.Sequential around an nnsparse encoder
    "Sequential(SparseLinearBatch)": Case(_sequential, lambda m, x: m(x)),
    "SparseLinearBatch": Case(lambda: nnsparse.SparseLinearBatch(WIDTH, HIDDEN),
                              lambda m, x: m(x)),
    "SparseWeightLinear": Case(
        lambda: nn.Sequential(nnsparse.SparseWeightLinear(_weight_pattern().to_sparse_csr()),
                              nn.Tanh()), lambda m, x: m(x)),
    "Densify": Case(lambda: nn.Sequential(nnsparse.Densify(WIDTH), nn.Linear(WIDTH, HIDDEN)),
                    lambda m, x: m(x)),
    "Sparsify": Case(  # a dense input, a sparse tensor inside the model
        lambda: nn.Sequential(nnsparse.Densify(WIDTH), nn.Linear(WIDTH, WIDTH),
                              nnsparse.Sparsify(), nnsparse.SparseLinearBatch(WIDTH, HIDDEN)),
        lambda m, x: m(x)),
    "SparseOutputLinear (user module)": Case(_Pattern, lambda m, x: m(x, x)),
    "PatternSequential": Case(
        lambda: nnsparse.PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), nn.Tanh(),
                                           nnsparse.SparseOutputLinear(HIDDEN, WIDTH)),
        lambda m, x: m(x, x)),
    "ValuesMap": Case(
        lambda: nnsparse.PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), nn.Tanh(),
                                           nnsparse.SparseOutputLinear(HIDDEN, WIDTH),
                                           nnsparse.ValuesMap(nn.Sigmoid())),
        lambda m, x: m(x, x)),
    "SparseCriterion (dense estimate)": Case(
        lambda: _Loss(_sequential(), nnsparse.SparseCriterion(nn.MSELoss())), lambda m, x: m(x, x)),
    "SparseCriterion (sparse estimate)": Case(
        lambda: _Loss(_Pattern(), nnsparse.SparseCriterion(nn.MSELoss()), pattern=True),
        lambda m, x: m(x, x)),
    "MaskCriterion": Case(
        lambda: _Loss(_sequential(), nnsparse.MaskCriterion(nn.MSELoss(), alpha=2.0, beta=0.5)),
        lambda m, x: m(x, x)),
    "SDAESparseCriterion": Case(
        lambda: _Loss(_Pattern(), nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=2.0, beta=0.5,
                                                               hide_ratio=0.5),
                      pattern=True),
        lambda m, x: m(x, x)),
}


def _prepared(module: nn.Module, x: Any) -> None:
    """A denoising criterion remembers the entries its prepare_input corrupted."""
    criterion = getattr(module, "criterion", None)
    if isinstance(criterion, (nnsparse.MaskCriterion, nnsparse.SDAESparseCriterion)):
        torch.manual_seed(1)
        criterion.prepare_input(x)


def _run(module: nn.Module, call: Callable[[nn.Module, Any], Any], x: Any
         ) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The output's numbers and every parameter gradient of one forward and backward."""
    module.zero_grad()
    out = _values(call(module, x))
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in module.named_parameters()
                          if p.grad is not None}


def _check(name: str, form: str, backend: str, steps: int = 2) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    model = case.build().double()
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend=backend)
    for seed in range(steps):  # a second batch: the guards and the cached frames
        x = make_form(_dense(seed), form)
        _prepared(model, x)
        want, want_grads = _run(model, case.call, x)
        _prepared(twin, x)
        got, got_grads = _run(twin, lambda _, batch: case.call(compiled, batch), x)
        torch.testing.assert_close(got, want)
        assert sorted(got_grads) == sorted(want_grads) == sorted(
            n for n, p in model.named_parameters() if p.grad is not None)
        assert want_grads, "no parameter got a gradient"
        for n in want_grads:
            torch.testing.assert_close(got_grads[n], want_grads[n], msg=n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["csr", "coo", "coo_uncoalesced", "list", "pair_list"])
def test_the_issue_model_compiles_on_every_form(form, backend):
    """torch.compile(nn.Sequential(SparseLinearBatch, ReLU, Linear))(x.to_sparse_csr()) failed
    inside dynamo with "IndexError: tuple index out of range" (nnsparse/_forms.py _check_csr)."""
    _check("Sequential(SparseLinearBatch)", form, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["csr", "coo"])
@pytest.mark.parametrize("name", [n for n in CASES if n != "Sequential(SparseLinearBatch)"])
def test_compiled_equals_eager(name, form, backend):
    _check(name, form, backend, steps=1)
