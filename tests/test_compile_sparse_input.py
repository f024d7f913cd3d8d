"""torch.compile of nnsparse modules, criteria and models fed torch sparse tensors.

Each nnsparse forward given a sparse form dynamo cannot fake (a CSR or COO tensor, a list
of rows) runs eagerly behind ``torch.compiler.disable`` (``nnsparse._forms.compile_boundary``):
a graph break at the nnsparse module, where a CSR batch failed inside dynamo.  These tests
check that the compiled run equals the eager one, output and every parameter gradient (in
float64), for each module, criterion and model, sparse form and backend, which dense code
dynamo compiles around the break, and fullgraph=True's error; ``tests/test_compile.py``
covers the ``SparseParts`` path, which compiles the nnsparse layers too, without a break.
"""
import copy
import os
import shutil
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import pytest
import torch
from torch import Tensor, nn

import nnsparse
from nnsparse.data import SparseRowDataset, synthetic_ratings
from nnsparse.models import CFN, AutoRec, KernelNet
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
    if isinstance(out, (list, tuple)):  # a list of sparse rows, as given
        return torch.stack([_values(row) for row in out])
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
    # Mult-VAE's input: each row divided by its L2 norm before the encoder
    "Normalize": Case(
        lambda: nn.Sequential(nnsparse.Normalize(), nnsparse.SparseLinearBatch(WIDTH, HIDDEN),
                              nn.Tanh()), lambda m, x: m(x)),
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


class _MainExample(nn.Module):
    """examples/movielens_autoencoder.py's model, its last activation nnsparse.values_map."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(WIDTH, HIDDEN)
        self.decoder = nnsparse.SparseOutputLinear(HIDDEN, WIDTH)

    def forward(self, x: Any, pattern: Any) -> Any:
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


class _Function(nn.Module):
    """A public function of nnsparse inside a user's forward, with parameters to train."""

    def __init__(self, fn: Callable[["_Function", Any], Any]) -> None:
        super().__init__()
        self.fn = fn
        self.weight = nn.Parameter(torch.randn(HIDDEN, WIDTH))
        self.h = nn.Parameter(torch.randn(ROWS, HIDDEN))
        self.layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN)

    def forward(self, x: Any) -> Any:
        return self.fn(self, x)


def _function(fn: Callable[[_Function, Any], Any]) -> Case:
    return Case(lambda: _Function(fn), lambda m, x: m(x))


CASES.update({
    "main example (values_map)": Case(_MainExample, lambda m, x: m(x, x)),
    "sparse_linear": _function(lambda m, x: torch.tanh(nnsparse.sparse_linear(x, m.weight))),
    "sampled_linear": _function(lambda m, x: nnsparse.sampled_linear(m.h, m.weight.T,
                                                                      pattern=x)),
    "sparse_mm": _function(lambda m, x: nnsparse.sparse_mm(x, m.weight.T).sin()),
    "densify": _function(lambda m, x: nnsparse.densify(x, size=(ROWS, WIDTH)) @ m.weight.T),
    "sparsify": _function(lambda m, x: nnsparse.sparse_linear(
        nnsparse.sparsify(nnsparse.densify(x, size=(ROWS, WIDTH)) * m.weight.sum(0)),
        m.weight)),
    "sparse_parts": _function(lambda m, x: m.layer(nnsparse.sparse_parts(x))),
    "prepare_input inside": Case(
        lambda: _Loss(_Pattern(), nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=2.0,
                                                               hide_ratio=0.5), pattern=True),
        lambda m, x: m(_seeded(m.criterion.prepare_input, x), x)),
})


def _seeded(fn: Callable[[Any], Any], x: Any) -> Any:
    torch.manual_seed(2)
    return fn(x)


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


# (the issue's model above runs every form on both backends; the nnsparse code behind the
# break runs eagerly whatever the backend, so one backend a form keeps the file under 20 s)
@pytest.mark.parametrize("form, backend", [("csr", "aot_eager"), ("coo", "eager"),
                                           ("list", "eager")])
@pytest.mark.parametrize("name", [n for n in CASES if n != "Sequential(SparseLinearBatch)"])
def test_compiled_equals_eager(name, form, backend):
    _check(name, form, backend, steps=1)


@pytest.mark.parametrize("form", ["csr", "coo"])
def test_inductor(form):
    """The default backend on the issue's model (nn.Sequential runs as Python around the
    break: dynamo skips torch.nn's own frames, so inductor builds no C++ here)."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("inductor needs a C++ compiler on the CPU")
    _check("Sequential(SparseLinearBatch)", form, "inductor")


def test_sdae_criterion_on_dense_data_compiles_without_a_break():
    """SDAECriterion takes dense tensors only: the boundary leaves it in the graph."""
    criterion = nnsparse.SDAECriterion(nn.MSELoss(), alpha=2.0, beta=0.5, noise_ratio=0.5)
    x = _dense()
    torch.manual_seed(1)
    criterion.prepare_input(x)
    estimate = torch.randn(ROWS, WIDTH, dtype=torch.float64, requires_grad=True)
    want = criterion(estimate, x)
    (want_grad,) = torch.autograd.grad(want, estimate)
    report = torch._dynamo.explain(criterion)(estimate, x)
    assert report.graph_break_count == 0, report.break_reasons
    torch._dynamo.reset()
    got = torch.compile(criterion, backend="aot_eager", fullgraph=True)(estimate, x)
    (got_grad,) = torch.autograd.grad(got, estimate)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


# -- the models of nnsparse.models: forward(x, rows, pattern) -------------------------------
@pytest.fixture(scope="module")
def ratings():
    return synthetic_ratings(seed=3, n_users=40, n_items=30, n_ratings=500)


@pytest.mark.parametrize("pattern", [False, True], ids=["dense output", "pattern"])
@pytest.mark.parametrize("cls, extra", [(AutoRec, {}), (CFN, {}), (KernelNet, dict(layers=1))],
                         ids=["AutoRec", "CFN", "KernelNet"])
def test_models(ratings, cls, extra, pattern):
    torch.manual_seed(0)
    model = cls(hidden=8, epochs=1, batch_size=16, validation_ratio=0.0, **extra).fit(
        ratings, verbose=False, progress=False)
    data = SparseRowDataset(model._input)
    batch = data.collate([data[i] for i in range(ROWS)])
    x, rows = batch.input, batch.row_index
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="aot_eager")

    def call(module: nn.Module, batch: Any) -> Any:
        return module(batch, rows, batch if pattern else None)
    want, want_grads = _run(model, call, x)
    got, got_grads = _run(twin, lambda _, b: call(compiled, b), x)
    torch.testing.assert_close(got, want)
    assert want_grads and sorted(got_grads) == sorted(want_grads)
    for n in want_grads:
        torch.testing.assert_close(got_grads[n], want_grads[n], msg=n)


# -- what dynamo compiles around the break, and fullgraph=True -------------------------------
class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h: Tensor) -> Tensor:
        return torch.tanh(self.linear(torch.relu(h)))


@pytest.mark.parametrize("form", ["csr", "coo", "list"])
def test_the_dense_modules_after_the_break_compile(form):
    """dynamo runs the frames holding the torch sparse tensor as Python; a user's module
    after the nnsparse layer gets a dense tensor, and its frame is compiled."""
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN), _Head()).double()
    graphs: List[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm)
        return gm.forward
    compiled = torch.compile(model, backend=backend)
    x = make_form(_dense(), form)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 1  # compiled once, reused
    ops = {getattr(n.target, "__name__", str(n.target)) for n in graphs[0].graph.nodes
           if n.op == "call_function"}
    assert {"relu", "linear", "tanh"} <= ops, ops


@pytest.mark.parametrize("form", ["csr", "coo"])
def test_fullgraph_on_a_torch_sparse_tensor_is_dynamos_error(form):
    """fullgraph=True has no break to take, and dynamo refuses to wrap the sparse tensor
    before nnsparse's code can say anything (its "from user code" lines, where it prints
    them, quote nnsparse's line, whose comment names nnsparse.sparse_parts(x))."""
    compiled = torch.compile(_sequential().double(), backend="eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Attempted to wrap sparse Tensor"):
        compiled(make_form(_dense(), form))


@pytest.mark.parametrize("form", ["list", "pair_list"])
def test_fullgraph_on_a_list_of_rows_names_sparse_parts(form):
    """dynamo's error names the disabled function and the reason nnsparse gave it."""
    model = _sequential().double()
    x = make_form(_dense(), form)
    # (the disabled forms are made at the first break of the process: a first break inside
    # fullgraph=True names torch.compiler.disable instead)
    torch.compile(model, backend="eager")(x)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported,
                       match=r"(?s)Skip calling `torch.compiler.disable\(\)`d function.*"
                             r"give the compiled model nnsparse.sparse_parts\(x\)"):
        compiled(x)


def test_sparse_parts_still_compile_whole_after_a_sparse_input():
    """The torch sparse input's fallback marks frames dynamo gave up on; a SparseParts batch
    of the same layers, in the same process (no reset), still compiles as one graph."""
    torch.manual_seed(0)
    model = _Pattern().double()
    x = _dense()
    csr = x.to_sparse_csr()
    torch.compile(model, backend="eager")(csr, csr)
    parts = nnsparse.sparse_parts(csr)
    report = torch._dynamo.explain(model)(parts, parts)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons
    out = torch.compile(model, backend="aot_eager", fullgraph=True)(parts, parts)
    torch.testing.assert_close(out.to_sparse_csr().to_dense(), model(csr, csr).to_dense())


def test_batchifier_runs_a_compiled_network():
    """Batchifier feeds the compiled network CSR batches: each breaks at the nnsparse layer."""
    torch.manual_seed(0)
    model = _sequential().double()
    x = random_sparse_dense(20, WIDTH, 0.4, generator=torch.Generator().manual_seed(2))
    want = nnsparse.Batchifier(model, WIDTH, batch_size=6, progress=False)(x.to_sparse_csr())
    got = nnsparse.Batchifier(torch.compile(model, backend="aot_eager"), WIDTH, batch_size=6,
                              progress=False)(x.to_sparse_csr())
    torch.testing.assert_close(got, want)


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for a, b in zip(got, want):
            _assert_same(a, b)
    else:
        assert got.layout == want.layout
        torch.testing.assert_close(_values(got), _values(want))


@pytest.mark.parametrize("name, fn", [
    ("to_pairs", nnsparse.to_pairs),
    ("from_pairs", lambda x: nnsparse.from_pairs(nnsparse.to_pairs(x), size=WIDTH)),
    ("ssort", lambda x: nnsparse.ssort(x, descending=True)),
    ("ssort_by_index", nnsparse.ssort_by_index),
    ("stopk", lambda x: nnsparse.stopk(x, 2)),
    ("criteria.prepare_input", lambda x: nnsparse.prepare_input(nnsparse.SparseCriterion(
        nn.MSELoss()), x)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_toolkit_functions(name, fn):
    x = _dense().to_sparse_csr()
    _assert_same(torch.compile(fn, backend="eager")(x), fn(x))


# -- eager calls, the boundary's wrapper, torch without the private callback read ----------
def test_eager_calls_never_take_the_disabled_path(monkeypatch):
    """torch.compile off: each wrapped function calls its forward itself (no
    torch.compiler.disable, which loads torch._dynamo and costs an eager call ~3 us)."""
    def refuse(forward: Any) -> Any:
        raise AssertionError(f"{forward.__qualname__} took the disabled path in eager code")
    monkeypatch.setattr(nnsparse._forms, "_disabled", refuse)
    x = _dense()
    for form in ("csr", "coo", "list", "pair_list"):
        batch = make_form(x, form)
        torch.testing.assert_close(nnsparse.densify(batch, size=(ROWS, WIDTH)), x)
        nnsparse.SparseLinearBatch(WIDTH, HIDDEN).double()(batch)
        nnsparse.values_map(torch.tanh, batch)
    nnsparse.from_pairs(nnsparse.to_pairs(x[0].to_sparse()), size=WIDTH)
    nnsparse.Sparsify()(x)


@pytest.mark.parametrize("wrapped", [
    nnsparse.values_map, nnsparse.normalize, nnsparse.sparse_mm, nnsparse.sparse_linear,
    nnsparse.sampled_linear,
    nnsparse.densify, nnsparse.sparsify, nnsparse.ssort, nnsparse.stopk, nnsparse.sparse_parts,
    nnsparse.SparseLinearBatch.forward, nnsparse.SparseOutputLinear.forward,
    nnsparse.Normalize.forward,
    nnsparse.SparseCriterion.forward, nnsparse.SDAESparseCriterion.prepare_input,
    nnsparse.models.RatingModel.forward], ids=lambda f: f.__qualname__)
def test_the_boundary_keeps_name_signature_and_doc(wrapped):
    import inspect
    forward = wrapped.__wrapped__
    assert forward in nnsparse._forms._BEHIND_BOUNDARY
    assert (wrapped.__name__, wrapped.__qualname__, wrapped.__module__, wrapped.__doc__) == (
        forward.__name__, forward.__qualname__, forward.__module__, forward.__doc__)
    assert inspect.signature(wrapped) == inspect.signature(forward)


def test_without_torchs_private_callback_read(monkeypatch):
    """torch._C._dynamo.eval_frame.get_eval_frame_callback is private: a torch without it
    gets a stand-in, "off" until torch._dynamo is loaded, then "on" (every torch sparse
    input under it takes the disabled path, eager calls too: same results)."""
    from nnsparse._forms import _callback_reader
    import types
    assert _callback_reader(types.SimpleNamespace())  # callable
    assert _callback_reader(None, modules={})() is None
    assert _callback_reader(types.SimpleNamespace(), modules={"torch._dynamo": torch})() is True
    read = torch._C._dynamo.eval_frame.get_eval_frame_callback
    assert _callback_reader(types.SimpleNamespace(get_eval_frame_callback=read)) is read
    monkeypatch.setattr(nnsparse._forms, "_eval_frame_callback", _callback_reader(None))
    x = _dense()
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN).double()
    torch.testing.assert_close(layer(x.to_sparse_csr()), layer(x))  # eager, disabled path
    _check("Sequential(SparseLinearBatch)", "csr", "eager", steps=1)
    parts = nnsparse.sparse_parts(x.to_sparse_csr())  # still one graph
    report = torch._dynamo.explain(layer)(parts)
    assert report.graph_break_count == 0 and report.graph_count == 1, report.break_reasons


@pytest.mark.parametrize("form", ["csr", "list"])
def test_autocast_crosses_the_break(form):
    """The eager forward behind the break runs under the caller's autocast (and grad mode)."""
    torch.manual_seed(0)
    model = _sequential()
    x = make_form(_dense().float(), form)
    compiled = torch.compile(model, backend="eager")
    for grad in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(grad):
            want, got = model(x), compiled(x)
        assert got.dtype == want.dtype and got.requires_grad == want.requires_grad == grad
        torch.testing.assert_close(got, want)
