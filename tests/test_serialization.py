"""Whole nnsparse modules through torch.save / torch.load(weights_only=True)."""
import io

import pytest
import torch
from torch import nn

import nnsparse

_g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
# Every nn.Module nnsparse exports, with the arguments that change what it pickles.
CASES = {
    "SparseLinearBatch": lambda: nnsparse.SparseLinearBatch(6, 3),
    "SparseLinearBatch-sparse_grad": lambda: nnsparse.SparseLinearBatch(6, 3, sparse_grad=True),
    "SparseOutputLinear": lambda: nnsparse.SparseOutputLinear(3, 6, sparse_grad=True),
    "Densify": lambda: nnsparse.Densify(6, elem=-1.0),
    "Sparsify": lambda: nnsparse.Sparsify(offset=2, layout=torch.sparse_csr),
    "PatternSequential": lambda: nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 3), nnsparse.SparseOutputLinear(3, 6)),
    "SparseWeightLinear": lambda: nnsparse.SparseWeightLinear.random(6, 3, 0.5, seed=1),
    "SparseCriterion": lambda: nnsparse.SparseCriterion(nn.L1Loss(), size_average=False),
    "SDAECriterion": lambda: nnsparse.SDAECriterion(nn.MSELoss(), alpha=2.0, generator=_g()),
    "SDAESparseCriterion": lambda: nnsparse.SDAESparseCriterion(
        nn.BCEWithLogitsLoss(), hide_ratio=0.25, generator=_g()),
    "MaskCriterion": lambda: nnsparse.MaskCriterion(nn.HuberLoss(), alpha=0.5),
}
# ValuesMap holds a user's function: the user allows it (see test_values_map).
NOT_HERE = {"ValuesMap"}


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True, **load_kwargs)


def test_every_exported_module_is_covered():
    exported = {name for name in nnsparse.__all__
                if isinstance(getattr(nnsparse, name), type)
                and issubclass(getattr(nnsparse, name), nn.Module)}
    covered = {name.split("-")[0] for name in CASES} | NOT_HERE
    assert exported <= covered, f"add a case for {sorted(exported - covered)}"


@pytest.mark.parametrize("name", list(CASES))
def test_whole_module_loads_with_weights_only(name):
    torch.manual_seed(0)
    module = CASES[name]()
    loaded = _round_trip(module)
    assert type(loaded) is type(module)
    assert repr(loaded) == repr(module)
    for (k, a), (k2, b) in zip(module.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert vars(loaded).keys() == vars(module).keys()


def test_loaded_layers_compute_the_same():
    torch.manual_seed(0)
    model = CASES["PatternSequential"]()
    loaded = _round_trip(model)
    x = torch.tensor([[1., 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 1]]).to_sparse()
    torch.testing.assert_close(loaded(x, x).to_dense(), model(x, x).to_dense())
    sg = _round_trip(CASES["SparseLinearBatch-sparse_grad"]())
    sg(x).sum().backward()  # the sparse-gradient layout and state_dict hooks survive
    assert sg.weight_t.grad.is_sparse and "weight" in sg.state_dict()


def test_loaded_criterion_keeps_its_generator_stream():
    crit = CASES["SDAESparseCriterion"]()
    loaded = _round_trip(crit)
    x = torch.tensor([[1., 0, 0, 2, 0, 4], [0, 0, 3, 0, 5, 1]]).to_sparse()
    a, b = crit.prepare_input(x), loaded.prepare_input(x)
    torch.testing.assert_close(a.to_dense(), b.to_dense())


def test_values_map():
    # A torch function pickles through builtins.getattr, which nnsparse does not allow;
    # a module as the function loads once the user allows its class.
    with pytest.raises(Exception, match="getattr"):
        _round_trip(nnsparse.ValuesMap(torch.tanh))
    with torch.serialization.safe_globals([nn.Tanh]):
        loaded = _round_trip(nnsparse.ValuesMap(nn.Tanh()))
    x = torch.tensor([0.5, 0, -1]).to_sparse()
    torch.testing.assert_close(loaded(x).to_dense(), torch.tanh(x.to_dense()))


def test_user_model_needs_its_own_classes_and_state_dict_needs_none():
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 3), nn.Tanh(),
                          nnsparse.SparseOutputLinear(3, 6))
    with pytest.raises(Exception, match="Sequential"):
        _round_trip(model)
    with torch.serialization.safe_globals([nn.Sequential, nn.Tanh]):
        assert isinstance(_round_trip(model), nn.Sequential)
    state = _round_trip(model.state_dict())
    fresh = nn.Sequential(nnsparse.SparseLinearBatch(6, 3), nn.Tanh(),
                          nnsparse.SparseOutputLinear(3, 6))
    fresh.load_state_dict(state)
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(a, b)
