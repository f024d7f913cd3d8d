"""torch.nn.Module protocols for every module nnsparse exports.

One table of constructors; each protocol (repr, dtype/device factory kwargs,
``reset_parameters``, ``.to``/``.half``, ``state_dict`` through
``torch.save``/``torch.load(weights_only=True)``, ``copy.deepcopy``, pickling) is
checked on every row, so a new module must join the table
(``test_every_exported_module_is_in_the_table``).
"""
import copy
import inspect
import io
import pickle

import pytest
import torch
from torch import nn

import nnsparse

_g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
# name -> (constructor taking factory kwargs, expected repr); a module without
# parameters takes no factory kwargs (nn.ReLU, nn.MSELoss neither).
CASES = {
    "SparseLinearBatch": (
        lambda **kw: nnsparse.SparseLinearBatch(6, 3, **kw),
        "SparseLinearBatch(in_features=6, out_features=3, bias=True, sparse_grad=False, "
        "mode='auto')"),
    "SparseLinearBatch-sparse_grad": (
        lambda **kw: nnsparse.SparseLinearBatch(6, 3, bias=False, sparse_grad=True,
                                                mode="sparse", **kw),
        "SparseLinearBatch(in_features=6, out_features=3, bias=False, sparse_grad=True, "
        "mode='sparse')"),
    "SparseOutputLinear": (
        lambda **kw: nnsparse.SparseOutputLinear(3, 6, sparse_grad=True, **kw),
        "SparseOutputLinear(in_features=3, out_features=6, bias=True, sparse_grad=True)"),
    "SparseWeightLinear": (
        lambda **kw: nnsparse.SparseWeightLinear.random(6, 3, 0.5, seed=1, **kw),
        "SparseWeightLinear(in_features=6, out_features=3, nnz=9, bias=True)"),
    "SparseWeightLinear-pattern": (
        lambda **kw: nnsparse.SparseWeightLinear(torch.eye(3).to_sparse_csr(), bias=False,
                                                 **kw),
        "SparseWeightLinear(in_features=3, out_features=3, nnz=3, bias=False)"),
    "Densify": (lambda: nnsparse.Densify(6, elem=-1.0), "Densify(in_features=6, elem=-1.0)"),
    "Sparsify": (lambda: nnsparse.Sparsify(offset=2, layout=torch.sparse_csr),
                 "Sparsify(elem=0, offset=2, layout=torch.sparse_csr)"),
    "Normalize": (lambda: nnsparse.Normalize(p=1, eps=0.5), "Normalize(p=1.0, dim=1, eps=0.5)"),
    "PatternSequential": (
        lambda: nnsparse.PatternSequential(nnsparse.SparseLinearBatch(6, 3),
                                           nnsparse.SparseOutputLinear(3, 6)),
        "PatternSequential(\n"
        "  (0): SparseLinearBatch(in_features=6, out_features=3, bias=True, sparse_grad=False, "
        "mode='auto')\n"
        "  (1): SparseOutputLinear(in_features=3, out_features=6, bias=True, sparse_grad=False)\n"
        ")"),
    "ValuesMap": (lambda: nnsparse.ValuesMap(torch.tanh), "ValuesMap(fn=tanh)"),
    "ValuesMap-module": (lambda: nnsparse.ValuesMap(nn.Tanh()),
                         "ValuesMap(\n  (fn): Tanh()\n)"),
    "SparseCriterion": (
        lambda: nnsparse.SparseCriterion(nn.L1Loss(), size_average=False),
        "SparseCriterion(\n  size_average=False, full_size_average=False\n"
        "  (criterion): L1Loss()\n)"),
    "SDAECriterion": (
        lambda: nnsparse.SDAECriterion(nn.MSELoss(), alpha=2.0, generator=_g()),
        "SDAECriterion(\n  alpha=2.0, beta=0.0, noise_ratio=0.0, noise_mean=0.0, noise_std=0.2, "
        "flip_ratio=0.0, flip_range=(-1.0, 1.0), hide_ratio=0.0, size_average=True\n"
        "  (criterion): MSELoss()\n)"),
    "SDAESparseCriterion": (
        lambda: nnsparse.SDAESparseCriterion(nn.BCEWithLogitsLoss(), hide_ratio=0.25,
                                             generator=_g()),
        "SDAESparseCriterion(\n  alpha=1.0, beta=0.0, noise_ratio=0.0, noise_mean=0.0, "
        "noise_std=0.2, flip_ratio=0.0, flip_range=(-1.0, 1.0), hide_ratio=0.25, "
        "size_average=True\n  (criterion): BCEWithLogitsLoss()\n)"),
    "MaskCriterion": (
        lambda: nnsparse.MaskCriterion(nn.HuberLoss(), alpha=0.5),
        "MaskCriterion(\n  alpha=0.5, beta=0.0, hide_ratio=0.0, size_average=True\n"
        "  (criterion): HuberLoss()\n)"),
}
WITH_PARAMETERS = [name for name in CASES if "Linear" in name]


def _exported_modules():
    return {name for name in nnsparse.__all__
            if isinstance(getattr(nnsparse, name), type)
            and issubclass(getattr(nnsparse, name), nn.Module)}


def _make(name, **kw):
    torch.manual_seed(0)
    return CASES[name][0](**kw)


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def test_every_exported_module_is_in_the_table():
    covered = {name.split("-")[0] for name in CASES}
    assert _exported_modules() <= covered, f"add a row for {sorted(_exported_modules() - covered)}"


@pytest.mark.parametrize("name", list(CASES))
def test_repr_shows_the_constructor_arguments(name):
    assert repr(_make(name)) == CASES[name][1]


@pytest.mark.parametrize("name", WITH_PARAMETERS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_factory_kwargs_as_nn_linear(name, dtype):
    module = _make(name, dtype=dtype, device="cpu")
    assert all(p.dtype == dtype and p.device.type == "cpu" for p in module.parameters())
    index_buffers = [b for b in module.buffers() if not b.is_floating_point()]
    assert all(b.dtype in (torch.int32, torch.int64) for b in index_buffers)
    meta = _make(name, device="meta")
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    assert "device" in inspect.signature(type(module)).parameters


@pytest.mark.parametrize("name", WITH_PARAMETERS)
def test_reset_parameters_reinitialises_as_the_constructor(name):
    fresh = _make(name)
    module = _make(name)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(7.0)
    torch.manual_seed(0)
    assert module.reset_parameters() is None
    _same_state(module, fresh)
    # torch's rule: a layer's parameters are only ever re-drawn, never replaced.
    ids = [id(p) for p in module.parameters()]
    module.reset_parameters()
    assert [id(p) for p in module.parameters()] == ids


@pytest.mark.parametrize("name", list(CASES))
def test_to_and_half_convert_floating_state_only(name):
    module = _make(name)
    before = {k: v.dtype for k, v in module.state_dict().items()}
    for convert, dtype in ((lambda m: m.to(torch.float64), torch.float64),
                           (lambda m: m.half(), torch.float16),
                           (lambda m: m.float(), torch.float32)):
        assert convert(module) is module
        for key, value in module.state_dict().items():
            expected = dtype if before[key].is_floating_point else before[key]
            assert value.dtype == expected, key
    assert repr(module) == CASES[name][1]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_are_equal_and_independent(name, how):
    module = _make(name)
    clone = copy.deepcopy(module) if how == "deepcopy" else pickle.loads(pickle.dumps(module))
    assert type(clone) is type(module) and repr(clone) == repr(module)
    _same_state(clone, module)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(1.0)
    for p, q in zip(module.parameters(), clone.parameters()):
        assert not torch.equal(p, q)


@pytest.mark.parametrize("name", list(CASES))
def test_state_dict_round_trips_through_a_weights_only_load(name):
    module = _make(name)
    buf = io.BytesIO()
    torch.save(module.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    torch.manual_seed(1)  # another draw: the load, not the seed, must make them equal
    target = CASES[name][0]()
    assert target.load_state_dict(state) is not None  # torch's _IncompatibleKeys
    _same_state(target, module)
