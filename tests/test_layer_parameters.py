"""A layer's parameter replaced by one of another shape, dtype, device or kind is named in forward.

``layer.weight = nn.Parameter(w)`` of the wrong shape used to surface as a wrong
input width ("input has width 4, smaller than in_features 5" for a layer built
with in_features 4), a torch broadcast error, or a silently wrong result
(SparseWeightLinear with more values than positions, a float64 bias promoting
the output).  Each layer now names the parameter, the expected shape and what
came, on every input path (sparse, dense, a pattern or none, SparseParts).
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnsparse
from matrix import DEVICES, TOL, random_sparse_dense

SLB_WEIGHT = r"SparseLinearBatch.weight must have shape \(out_features, in_features\) = \(3, 4\), "
SOL_WEIGHT = r"SparseOutputLinear.weight must have shape \(out_features, in_features\) = \(4, 3\), "
SWL_VALUES = r"SparseWeightLinear.values must have shape \(nnz,\) = \(3,\), "


def _param(shape, dtype=torch.float32, device="cpu"):
    return nn.Parameter(torch.randn(shape, dtype=dtype, device=device))


def _ids(cases):
    """Readable test ids: the parameter and what it was replaced by."""
    def what(value):
        if not isinstance(value, torch.Tensor):
            return type(value).__name__
        if value.layout != torch.strided:
            return str(value.layout).replace("torch.", "")
        text = "x".join(map(str, value.shape))
        if value.dtype != torch.float32:
            text += "-" + str(value.dtype).replace("torch.", "")
        return text + ("-" + value.device.type if value.device.type != "cpu" else "")
    return [f"{name}={what(value)}" for name, value, _, _ in cases]


# (what is assigned, error type, message)
LINEAR_CASES = [
    ("weight", _param((3, 5)), ValueError, SLB_WEIGHT + r"got \(3, 5\)"),
    ("weight", _param((2, 4)), ValueError, SLB_WEIGHT + r"got \(2, 4\)"),
    ("weight", _param((4, 3)), ValueError, SLB_WEIGHT + r"got \(4, 3\)"),
    ("weight", _param((3,)), ValueError, SLB_WEIGHT + r"got \(3,\)"),
    ("weight", _param((3, 4, 1)), ValueError, SLB_WEIGHT + r"got \(3, 4, 1\)"),
    ("weight", None, TypeError, r"SparseLinearBatch.weight must be a dense tensor, got NoneType"),
    ("weight", nn.Parameter(torch.randn(3, 4).to_sparse()), TypeError,
     r"SparseLinearBatch.weight must be a dense tensor, got torch.sparse_coo"),
    ("weight", _param((3, 4), torch.float64), ValueError,
     r"SparseLinearBatch.weight and SparseLinearBatch.bias must have one dtype, "
     r"got torch.float64 and torch.float32"),
    ("bias", _param((4,)), ValueError,
     r"SparseLinearBatch.bias must have shape \(out_features,\) = \(3,\), got \(4,\)"),
    ("bias", _param((3, 1)), ValueError,
     r"SparseLinearBatch.bias must have shape \(out_features,\) = \(3,\), got \(3, 1\)"),
    ("bias", _param((3,), torch.float64), ValueError,
     r"SparseLinearBatch.weight and SparseLinearBatch.bias must have one dtype, "
     r"got torch.float32 and torch.float64"),
    ("bias", _param((3,), device="meta"), ValueError,
     r"SparseLinearBatch.weight and SparseLinearBatch.bias must be on one device, "
     r"got cpu and meta"),
    ("bias", nn.Parameter(torch.randn(3).to_sparse()), TypeError,
     r"SparseLinearBatch.bias must be a dense tensor, got torch.sparse_coo"),
]


def _linear_inputs():
    dense = torch.tensor([[1., 0., 0., 2.], [0., 3., 0., 0.]])
    return {"coo": dense.to_sparse(), "csr": dense.to_sparse_csr(), "dense": dense,
            "parts": nnsparse.sparse_parts(dense.to_sparse_csr())}


@pytest.mark.parametrize("mode", ["sparse", "dense"])
@pytest.mark.parametrize("form", ["coo", "csr", "dense", "parts"])
@pytest.mark.parametrize("name, value, error, message", LINEAR_CASES,
                         ids=_ids(LINEAR_CASES))
def test_sparse_linear_batch_names_a_wrong_parameter(name, value, error, message, form, mode):
    layer = nnsparse.SparseLinearBatch(4, 3, mode=mode)
    setattr(layer, name, value)
    with pytest.raises(error, match=message):
        layer(_linear_inputs()[form])


WEIGHT_T_CASES = [
    ("weight_t", _param((5, 3)), ValueError, r"SparseLinearBatch.weight_t must have shape "
     r"\(in_features, out_features\) = \(4, 3\), got \(5, 3\)"),
    ("weight_t", _param((3, 4)), ValueError, r"SparseLinearBatch.weight_t must have shape "
     r"\(in_features, out_features\) = \(4, 3\), got \(3, 4\)"),
    ("weight_t", _param((4, 3), torch.float64), ValueError,
     r"SparseLinearBatch.weight_t and SparseLinearBatch.bias must have one dtype, "
     r"got torch.float64 and torch.float32"),
]


@pytest.mark.parametrize("form", ["coo", "dense"])
@pytest.mark.parametrize("name, value, error, message", WEIGHT_T_CASES,
                         ids=_ids(WEIGHT_T_CASES))
def test_sparse_grad_layer_names_a_wrong_weight_t(name, value, error, message, form):
    layer = nnsparse.SparseLinearBatch(4, 3, sparse_grad=True)
    setattr(layer, name, value)
    with pytest.raises(error, match=message):
        layer(_linear_inputs()[form])


SOL_CASES = [
    ("weight", _param((4, 5)), ValueError, SOL_WEIGHT + r"got \(4, 5\)"),
    ("weight", _param((5, 3)), ValueError, SOL_WEIGHT + r"got \(5, 3\)"),
    ("weight", _param((3, 4)), ValueError, SOL_WEIGHT + r"got \(3, 4\)"),
    ("weight", _param((4,)), ValueError, SOL_WEIGHT + r"got \(4,\)"),
    ("weight", None, TypeError, r"SparseOutputLinear.weight must be a dense tensor, got NoneType"),
    ("weight", _param((4, 3), torch.float64), ValueError,
     r"SparseOutputLinear.weight and SparseOutputLinear.bias must have one dtype, "
     r"got torch.float64 and torch.float32"),
    ("bias", _param((5,)), ValueError,
     r"SparseOutputLinear.bias must have shape \(out_features,\) = \(4,\), got \(5,\)"),
    ("bias", _param((3,)), ValueError,
     r"SparseOutputLinear.bias must have shape \(out_features,\) = \(4,\), got \(3,\)"),
    ("bias", _param((4,), torch.float64), ValueError,
     r"SparseOutputLinear.weight and SparseOutputLinear.bias must have one dtype, "
     r"got torch.float32 and torch.float64"),
    ("bias", _param((4,), device="meta"), ValueError,
     r"SparseOutputLinear.weight and SparseOutputLinear.bias must be on one device, "
     r"got cpu and meta"),
]


@pytest.mark.parametrize("pattern", ["coo", "csr", "none", "parts"])
@pytest.mark.parametrize("name, value, error, message", SOL_CASES, ids=_ids(SOL_CASES))
def test_sparse_output_linear_names_a_wrong_parameter(name, value, error, message, pattern):
    layer = nnsparse.SparseOutputLinear(3, 4)
    setattr(layer, name, value)
    target = _linear_inputs()
    with pytest.raises(error, match=message):
        layer(torch.randn(2, 3), None if pattern == "none" else target[pattern])


SWL_CASES = [
    ("values", _param((4,)), ValueError, SWL_VALUES + r"got \(4,\)"),
    ("values", _param((2,)), ValueError, SWL_VALUES + r"got \(2,\)"),
    ("values", _param((3, 1)), ValueError, SWL_VALUES + r"got \(3, 1\)"),
    ("values", None, TypeError, r"SparseWeightLinear.values must be a dense tensor, got NoneType"),
    ("values", _param((3,), torch.float64), ValueError,
     r"SparseWeightLinear.values and SparseWeightLinear.bias must have one dtype, "
     r"got torch.float64 and torch.float32"),
    ("values", _param((3,), device="meta"), ValueError,
     r"SparseWeightLinear.values and SparseWeightLinear.bias must be on one device, "
     r"got meta and cpu"),
    ("bias", _param((3,)), ValueError,
     r"SparseWeightLinear.bias must have shape \(out_features,\) = \(2,\), got \(3,\)"),
    ("bias", _param((2,), torch.float64), ValueError,
     r"SparseWeightLinear.values and SparseWeightLinear.bias must have one dtype, "
     r"got torch.float32 and torch.float64"),
    ("bias", _param((2,), device="meta"), ValueError,
     r"SparseWeightLinear.values and SparseWeightLinear.bias must be on one device, "
     r"got cpu and meta"),
]


@pytest.mark.parametrize("form", ["coo", "csr", "dense"])
def test_sparse_weight_linear_names_values_off_the_pattern_s_device(form):
    layer = nnsparse.SparseWeightLinear(torch.tensor([[1., 0., 1.], [0., 1., 0.]]).to_sparse(),
                                        bias=False)
    layer.values = _param((3,), device="meta")
    x = torch.tensor([[1., 0., 2.], [0., 3., 0.]])
    x = {"coo": x.to_sparse(), "csr": x.to_sparse_csr(), "dense": x}[form]
    with pytest.raises(ValueError, match=r"SparseWeightLinear.values must be on the device of "
                                         r"the pattern \(crow, col\) cpu, got meta"):
        layer(x)


@pytest.mark.parametrize("form", ["coo", "csr", "dense"])
@pytest.mark.parametrize("name, value, error, message", SWL_CASES, ids=_ids(SWL_CASES))
def test_sparse_weight_linear_names_a_wrong_parameter(name, value, error, message, form):
    layer = nnsparse.SparseWeightLinear(torch.tensor([[1., 0., 1.], [0., 1., 0.]]).to_sparse())
    setattr(layer, name, value)
    x = torch.tensor([[1., 0., 2.], [0., 3., 0.]])
    x = {"coo": x.to_sparse(), "csr": x.to_sparse_csr(), "dense": x}[form]
    with pytest.raises(error, match=message):
        layer(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["row_major", "column_major"])
@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_an_assigned_weight_of_the_right_shape_works_in_either_layout(layout, mode, device):
    """A row-major weight the user assigned keeps working (each call reads a copy of its
    transpose); a column-major one is the layer's own layout, read without a copy."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, mode=mode).to(device)
    weight = torch.randn(3, 6, device=device)
    if layout == "column_major":
        weight = weight.t().contiguous().t()
    layer.weight = nn.Parameter(weight)
    layer.bias = nn.Parameter(torch.randn(3, device=device))
    dense = random_sparse_dense(4, 6, 0.4, dtype=torch.float32, device=device)
    out = layer(dense.to_sparse())
    torch.testing.assert_close(out, F.linear(dense, weight, layer.bias), **TOL[torch.float32])
    out.sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(4, 3, device=device).t() @ dense,
                               **TOL[torch.float32])
    assert layer.weight.t().is_contiguous() == (layout == "column_major")


def test_right_shapes_of_another_dtype_together_are_the_layer_s_dtype():
    """A weight and bias assigned together in float64 are a float64 layer (nothing refused)."""
    layer = nnsparse.SparseOutputLinear(3, 4)
    layer.weight = _param((4, 3), torch.float64)
    layer.bias = _param((4,), torch.float64)
    h = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(layer(h), F.linear(h, layer.weight, layer.bias))
