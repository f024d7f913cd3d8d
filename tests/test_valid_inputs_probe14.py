"""The fourteenth probe: valid but unusual inputs that torch's own counterparts take.

Each row is a call that was refused before (docs/valid_inputs_probe14.md) beside the
plain form or the torch reference it must equal.  The guards at the end pin the
refusals the round kept on purpose (ints as flags; counts as 0-d tensors until session 16,
now taken: tests/test_counts.py).
"""
import numpy as np
import pytest
import torch

import nnsparse
from nnsparse import Batchifier, Densify, densify, from_pairs, sparsify

X = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.]])


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(Densify(4), torch.nn.Linear(4, 4))


def _topk(k):
    out = Batchifier(_net(), output_size=4, progress=False).topk(X.to_sparse_csr(), k)
    return out.values, out.indices


PAIRS = torch.tensor([[1., 3.], [3., 1.]])


def _built(index, size=(2, 4)):
    """A 2-D builder's tensor after append(index, 2.0) and build(size)."""
    b = nnsparse.DynamicSparseTensor(ndim=2)
    b.append(index, 2.0)
    return densify(b.build(size))


def _built_1d(size):
    b = nnsparse.DynamicSparseTensor()
    b.append(1, 3.0)
    return densify(b.build(size))

def _clipped(**flags):
    """The gradients of a small model after nnsparse.optim.clip_grad_norm_ / _value_."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(nnsparse.SparseLinearBatch(4, 3, sparse_grad=True),
                                torch.nn.Linear(3, 2))
    model(sparsify(X)).square().sum().backward()
    value = {k: v for k, v in flags.items() if k == "foreach"}
    norm = nnsparse.optim.clip_grad_norm_(model.parameters(), 0.5, **flags)
    nnsparse.optim.clip_grad_value_(model.parameters(), 0.1, **value)
    return (norm,) + tuple(p.grad.to_dense() for p in model.parameters())


def _assigned_sparse_grad(cls, flag):
    """A layer's output and weight gradient after ``layer.sparse_grad = flag``."""
    torch.manual_seed(0)
    layer = cls(4, 4)
    layer.sparse_grad = flag
    s = sparsify(X)
    if cls is nnsparse.SparseOutputLinear:
        out = densify(layer(torch.randn(2, 4), s))
    else:
        out = layer(s)
    out.sum().backward()
    return out.detach(), layer.weight.grad


def _titles(path, flag):
    return nnsparse.data.read_ratings(path, "ml-100k", titles=flag).titles


# (id, the call with the unusual input, the plain call it must equal)
ROWS = [
    ("densify_in_features_0d_tensor",
     lambda: Densify(torch.tensor(4))(sparsify(X)), lambda: Densify(4)(sparsify(X))),
    ("densify_in_features_0d_int32_tensor",
     lambda: Densify(torch.tensor(4, dtype=torch.int32))(sparsify(X)),
     lambda: Densify(4)(sparsify(X))),
    ("batchifier_output_size_0d_tensor",
     lambda: Batchifier(_net(), output_size=torch.tensor(4), progress=False)(X.to_sparse_csr()),
     lambda: Batchifier(_net(), output_size=4, progress=False)(X.to_sparse_csr())),
    ("batchifier_topk_k_0d_tensor", lambda: _topk(torch.tensor(2)), lambda: _topk(2)),
    ("batchifier_topk_k_numpy", lambda: _topk(np.int64(2)), lambda: _topk(2)),
    ("from_pairs_size_0d_tensor",
     lambda: densify(from_pairs(PAIRS, torch.tensor(5))), lambda: densify(from_pairs(PAIRS, 5))),
    ("sparsify_elem_0d_tensor",
     lambda: densify(sparsify(X, elem=torch.tensor(0.))), lambda: densify(sparsify(X, elem=0.))),
    ("sparsify_elem_0d_int_tensor",
     lambda: densify(sparsify(X, elem=torch.tensor(3))), lambda: densify(sparsify(X, elem=3))),
    ("densify_elem_0d_tensor",
     lambda: densify(sparsify(X), elem=torch.tensor(-1.)), lambda: densify(sparsify(X), elem=-1.)),
    ("Densify_layer_elem_0d_tensor",
     lambda: Densify(4, elem=torch.tensor(2.))(sparsify(X)), lambda: Densify(4, elem=2.)(sparsify(X))),
    ("builder_append_index_int64_tensor", lambda: _built(torch.tensor([1, 3])),
     lambda: _built((1, 3))),
    ("builder_append_index_int32_tensor",
     lambda: _built(torch.tensor([1, 3], dtype=torch.int32)), lambda: _built((1, 3))),
    ("builder_append_index_numpy_array", lambda: _built(np.array([1, 3])), lambda: _built((1, 3))),
    ("builder_append_index_of_an_index_tensor_column",
     lambda: _built(torch.tensor([[0, 1], [2, 3]])[:, 1]), lambda: _built((1, 3))),
    ("builder_build_size_1d_tensor", lambda: _built((1, 3), torch.tensor([2, 4])),
     lambda: _built((1, 3), (2, 4))),
    ("builder_build_size_lua_float_tensor", lambda: _built((1, 3), torch.tensor([2., 4.])),
     lambda: _built((1, 3), (2, 4))),
    ("builder_build_size_0d_tensor", lambda: _built_1d(torch.tensor(5)), lambda: _built_1d(5)),
    ("clip_grad_flags_numpy_bools",
     lambda: _clipped(error_if_nonfinite=np.True_, foreach=np.False_),
     lambda: _clipped(error_if_nonfinite=True, foreach=False)),
    ("linear_sparse_grad_assigned_numpy_bool",
     lambda: _assigned_sparse_grad(nnsparse.SparseLinearBatch, np.False_),
     lambda: _assigned_sparse_grad(nnsparse.SparseLinearBatch, False)),
    ("output_linear_sparse_grad_assigned_numpy_bool",
     lambda: _assigned_sparse_grad(nnsparse.SparseOutputLinear, np.False_),
     lambda: _assigned_sparse_grad(nnsparse.SparseOutputLinear, False)),
    ("Sparsify_layer_elem_0d_tensor",
     lambda: densify(nnsparse.Sparsify(elem=torch.tensor(0.))(X)),
     lambda: densify(nnsparse.Sparsify(elem=0.)(X))),
]


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(u, v) for u, v in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("call, plain", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_valid_input_equals_plain_form(call, plain):
    assert _same(call(), plain())


def test_read_ratings_titles_numpy_bool(tmp_path):
    (tmp_path / "u.data").write_text("1\t10\t5\t0\n2\t20\t3\t0\n")
    (tmp_path / "u.item").write_text("10|A (1995)|||\n20|B (1995)|||\n")
    path = tmp_path / "u.data"
    assert _titles(path, np.True_) == _titles(path, True) and _titles(path, True)
    assert _titles(path, np.False_) == _titles(path, False)
    train, _ = nnsparse.data.read_split(path, path, "ml-100k", titles=np.True_)
    assert train.titles == _titles(path, True)


def test_densify_layer_stores_a_python_int():
    layer = Densify(torch.tensor(4))
    assert type(layer.in_features) is int and layer.in_features == 4


def test_topk_k_tensor_matches_torch_topk():
    # torch.topk takes a 0-d k; Batchifier.topk's dense reference is torch.topk itself
    out = _net()(sparsify(X))
    values, indices = _topk(torch.tensor(2))
    ref = torch.topk(out, k=torch.tensor(2))
    assert torch.allclose(values, ref.values) and torch.equal(indices, ref.indices)


# what the widened checks still refuse: (id, call, error, message)
KEPT = [
    ("in_features_float_0d_tensor", lambda: Densify(torch.tensor(4.)), TypeError,
     r"in_features must be a non-negative int, got tensor\(4\.\)"),
    ("in_features_bool_0d_tensor", lambda: Densify(torch.tensor(True)), TypeError,
     r"in_features must be a non-negative int, got tensor\(True\)"),
    ("in_features_1d_tensor", lambda: Densify(torch.tensor([4])), TypeError,
     r"in_features must be a non-negative int, got tensor\(\[4\]\)"),
    ("in_features_negative_0d_tensor", lambda: Densify(torch.tensor(-1)), ValueError,
     r"in_features must be a non-negative int, got -1"),
    ("in_features_meta_tensor", lambda: Densify(torch.tensor(4, device="meta")), ValueError,
     r"in_features .*meta"),
    ("output_size_float_tensor",
     lambda: Batchifier(_net(), output_size=torch.tensor(4.), progress=False), TypeError,
     r"output_size must be an int >= 0, got tensor\(4\.\)"),
    ("topk_k_negative_tensor", lambda: _topk(torch.tensor(-1)), ValueError,
     r"k must be a non-negative int, got -1"),
    ("from_pairs_size_float_tensor", lambda: from_pairs(PAIRS, torch.tensor(5.)), TypeError,
     r"size must be a non-negative int, got tensor\(5\.\)"),
    ("from_pairs_size_torch_Size", lambda: from_pairs(PAIRS, torch.Size([5])), TypeError,
     r"size must be an int, got Size"),
    ("elem_1d_tensor", lambda: sparsify(X, elem=torch.tensor([0.])), TypeError,
     r"elem must be a number, got Tensor"),
    ("elem_bool_tensor", lambda: sparsify(X, elem=torch.tensor(False)), TypeError,
     r"elem must be a number, got Tensor"),
    ("builder_index_float_tensor", lambda: _built(torch.tensor([1., 3.])), TypeError,
     r"index must be a tuple of 2 ints, got Tensor"),
    ("builder_index_2d_tensor", lambda: _built(torch.tensor([[1, 3]])), TypeError,
     r"index must be a tuple of 2 ints, got Tensor"),
    ("builder_index_tensor_wrong_length", lambda: _built(torch.tensor([1, 3, 0])), ValueError,
     r"index must have 2 entries, got 3: \(1, 3, 0\)"),
    ("builder_index_negative_tensor", lambda: _built(torch.tensor([-1, 3])), ValueError,
     r"index must be non-negative, got \(-1, 3\)"),
    ("builder_index_meta_tensor", lambda: _built(torch.tensor([1, 3], device="meta")),
     TypeError, r"index must be a tuple of 2 ints, got Tensor"),
    ("builder_size_tensor_too_small", lambda: _built((1, 3), torch.tensor([2, 3])), ValueError,
     r"size must be at least \(2, 4\) to hold the entries, got \(2, 3\)"),
    ("builder_size_fractional_tensor", lambda: _built((1, 3), torch.tensor([2., 4.5])),
     ValueError, r"size given as a floating tensor must hold whole numbers, got 4.5"),
    ("clip_error_if_nonfinite_int", lambda: _clipped(error_if_nonfinite=1), TypeError,
     r"error_if_nonfinite must be a bool, got int 1"),
    ("clip_foreach_str", lambda: _clipped(foreach="y"), TypeError,
     r"foreach must be a bool or None, got str 'y'"),
    ("sparse_grad_assigned_int", lambda: _assigned_sparse_grad(nnsparse.SparseLinearBatch, 1),
     TypeError, r"sparse_grad must be a bool, got int 1"),
    ("output_sparse_grad_assigned_str",
     lambda: _assigned_sparse_grad(nnsparse.SparseOutputLinear, "y"), TypeError,
     r"sparse_grad must be a bool, got str 'y'"),
    # (a 0-d integer tensor batch_size or offset, kept refused here until session 16, is
    # taken as every count takes it: tests/test_counts.py)
    # kept on purpose: flags are bools (numpy bools pass), as torch.sort's descending
    ("bias_int_flag", lambda: nnsparse.SparseLinearBatch(4, 3, bias=0), TypeError,
     r"bias must be a bool, got int 0"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in KEPT], ids=[r[0] for r in KEPT])
def test_still_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


# -- the second reading of the probe ------------------------------------------------------------

def _parametrized_sparse_grad(cls, flag):
    """A weight-normed sparse_grad=True layer given ``layer.sparse_grad = flag``, trained."""
    torch.manual_seed(0)
    if cls is nnsparse.SparseLinearBatch:
        layer = torch.nn.utils.parametrizations.weight_norm(cls(4, 3, sparse_grad=True),
                                                            "weight_t")
        layer.sparse_grad = flag
        out = layer(sparsify(X))
    else:
        layer = torch.nn.utils.parametrizations.weight_norm(cls(5, 4, sparse_grad=True))
        layer.sparse_grad = flag
        out = densify(layer(torch.randn(2, 5), sparsify(X)))
    out.sum().backward()
    return layer


@pytest.mark.parametrize("cls", [nnsparse.SparseLinearBatch, nnsparse.SparseOutputLinear])
@pytest.mark.parametrize("flag", [True, np.True_], ids=["bool", "numpy-bool"])
def test_assigned_numpy_true_sparse_grad_trains_a_parametrized_weight(cls, flag):
    # np.True_ is truthy but not `True`: the dense gradients a parametrized weight gets
    # (torch's weight_norm failed in the backward on a sparse one, with "unsupported
    # memory format option") must not be skipped for it
    layer = _parametrized_sparse_grad(cls, flag)
    grads = [p.grad for p in layer.parameters()]
    assert len(grads) == 3 and all(g.layout == torch.strided for g in grads)


def _densify_learnable_elem():
    return densify(sparsify(X), elem=torch.nn.Parameter(torch.tensor(-1.)))


ELEM_GRAD = [
    ("densify", _densify_learnable_elem),
    ("Densify", lambda: Densify(4, elem=torch.nn.Parameter(torch.tensor(-1.)))),
    ("Densify_assigned", lambda: _assigned_elem(torch.nn.Parameter(torch.tensor(-1.)))),
]


def _assigned_elem(elem):
    layer = Densify(4)
    layer.elem = elem
    return layer(sparsify(X))


@pytest.mark.parametrize("call", [r[1] for r in ELEM_GRAD], ids=[r[0] for r in ELEM_GRAD])
def test_fill_elem_requiring_grad_is_refused(call):
    # masked_fill gives a 0-d value that requires grad its gradient; densify fills with the
    # number, so the gradient was silently lost: refused, naming elem and the way out
    with pytest.raises(ValueError, match=r"elem must not require grad.*elem\.detach\(\)"):
        call()


def test_fill_elem_requiring_grad_runs_without_grad_and_detached():
    want = densify(sparsify(X), elem=-1.)
    with torch.no_grad():
        assert torch.equal(_densify_learnable_elem(), want)
    elem = torch.nn.Parameter(torch.tensor(-1.))
    assert torch.equal(densify(sparsify(X), elem=elem.detach()), want)
    # sparsify's elem is compared, not filled: no gradient is lost, so it passes
    assert torch.equal(densify(sparsify(X, elem=elem)), densify(sparsify(X)))


BEYOND_INT64 = [
    ("in_features", lambda: Densify(torch.tensor(2 ** 63, dtype=torch.uint64)),
     r"in_features must be a non-negative int within int64 \(below 2\*\*63\), "
     r"got 9223372036854775808"),
    ("output_size", lambda: Batchifier(_net(), output_size=torch.tensor(2 ** 63, dtype=torch.uint64)),
     r"output_size must be an int >= 0 within int64 \(below 2\*\*63\), got 9223372036854775808"),
    ("k", lambda: _topk(torch.tensor(2 ** 63, dtype=torch.uint64)),
     r"k must be a non-negative int within int64 \(below 2\*\*63\), got 9223372036854775808"),
]


@pytest.mark.parametrize("call, message", [r[1:] for r in BEYOND_INT64],
                         ids=[r[0] for r in BEYOND_INT64])
def test_0d_uint64_count_beyond_int64_names_the_argument(call, message):
    # operator.index failed with torch's "value cannot be converted to type int64_t
    # without overflow", naming no argument; a Python int that large says this
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("flag", [True, np.True_], ids=["bool", "numpy-bool"])
def test_numpy_true_error_if_nonfinite_is_honoured(flag):
    # the row above compares finite norms only, where the flag does nothing
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1., float("nan"), 2.])
    with pytest.raises(RuntimeError, match=r"non-finite"):
        nnsparse.optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=flag)
    assert torch.equal(p.grad[0], torch.tensor(1.))  # nothing scaled before the refusal
