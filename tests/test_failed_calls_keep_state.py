"""Validate before you mutate: a failed call leaves every stateful object as it was.

One test per stateful entry point (the builder, criteria that remember a
mask, readers given maps): the call fails with a clear error and the object
gives the same results afterwards as before.  LazyAdam's case lives in
tests/test_optim.py.
"""
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import DynamicSparseTensor


def snapshot(builder):
    built = builder.build().coalesce()
    return len(builder), built.indices().tolist(), built.values().tolist()


def filled(dtype=torch.float32, ndim=1):
    b = DynamicSparseTensor(dtype=dtype, ndim=ndim)
    for i in range(5):
        b.append(i if ndim == 1 else (i, i), 2 * i + 1)
    return b


@pytest.mark.parametrize("dtype, call, error, message", [
    (torch.float32, lambda b: b.set(torch.tensor([[0.0, 1.0]], dtype=torch.complex64)),
     TypeError, "pairs indices must be real numbers"),
    (torch.int64, lambda b: b.set(torch.tensor([[0.0, 1.5]])),
     TypeError, "values must be real numbers fitting dtype torch.int64"),
    (torch.int8, lambda b: b.set(torch.tensor([[0, 1000]])),
     ValueError, r"values must fit in dtype torch.int8, whose range is \[-128, 127\], got 1000"),
    (torch.float32, lambda b: b.set(torch.tensor([[-1.0, 1.0]])),
     ValueError, "pairs indices must be non-negative"),
    (torch.float32, lambda b: b.set(torch.ones(2, 3)), ValueError, r"shape \(k, 2\)"),
    (torch.int8, lambda b: b.append(9, 1000),
     ValueError, r"value 1000 does not fit in dtype torch.int8: its range is \[-128, 127\]"),
    (torch.int16, lambda b: b.append(9, -40000), ValueError, "does not fit in dtype torch.int16"),
    (torch.float16, lambda b: b.append(9, 1e6),
     ValueError, r"value 1000000.0 does not fit in dtype torch.float16"),
    (torch.float32, lambda b: b.append(9, 1e39), ValueError, "does not fit in dtype torch.float32"),
    (torch.float32, lambda b: b.append(-1, 1.0), ValueError, "index must be non-negative"),
    (torch.float32, lambda b: b.append(1.5, 1.0), TypeError, "index must be an int, got float"),
    (torch.float32, lambda b: b.append(1, "x"), TypeError, "value must be a real number"),
    (torch.int8, lambda b: b.extend(torch.tensor([7, 8]), torch.tensor([1, 300])),
     ValueError, r"values must fit in dtype torch.int8, whose range is \[-128, 127\], got 300"),
    (torch.float16, lambda b: b.extend([7], torch.tensor([1e6], dtype=torch.float64)),
     ValueError, "values must fit in dtype torch.float16"),
    (torch.float32, lambda b: b.extend(torch.tensor([7, -8]), torch.ones(2)),
     ValueError, "indices must be non-negative"),
    (torch.int32, lambda b: b.extend([7], [0.5]), TypeError, "values must be real numbers fitting"),
    # the second bad-input probe
    (torch.float32, lambda b: b.append(9, torch.tensor([1.0, 2.0])), ValueError,
     r"value must be a single number, got a tensor of shape \(2,\)"),
    (torch.float32, lambda b: b.extend("ab", [1.0, 2.0]), TypeError,
     "indices must be a tensor or a sequence of numbers, got str"),
    (torch.float32, lambda b: b.build(size=5.0), TypeError, "size must be an int or a tuple of 1 ints"),
    (torch.float32, lambda b: b.set(torch.ones(1, 2, device="meta")), ValueError,
     "pairs must be on the builder's device cpu, got meta"),
    # the third probe: tensors without data read into the host buffers
    (torch.float32, lambda b: b.append(9, torch.tensor(1.0, device="meta")), ValueError,
     "value must be a number, got a tensor on the meta device"),
    (torch.float32, lambda b: b.append(torch.tensor(9, device="meta"), 1.0), ValueError,
     "index must be a number, got a tensor on the meta device"),
    (torch.float32, lambda b: b.append(torch.tensor([9.0, 1.0], device="meta")), TypeError,
     "on the meta device"),
])
def test_builder_failed_call_changes_nothing(dtype, call, error, message):
    b = filled(dtype)
    before = snapshot(b)
    with pytest.raises(error, match=message):
        call(b)
    assert snapshot(b) == before
    b.append(5, 3)  # still usable, and the entry lands after the old ones
    assert len(b) == 6


def test_builder_tuple_append_failure_changes_nothing():
    b = filled(torch.int8, ndim=2)
    before = snapshot(b)
    with pytest.raises(ValueError, match="does not fit in dtype torch.int8"):
        b.append((1, 2), 500)
    with pytest.raises(ValueError, match="index must be non-negative"):
        b.append((1, -2), 5)
    assert snapshot(b) == before


def test_narrow_builders_keep_values_in_range():
    b = DynamicSparseTensor(dtype=torch.int8)
    b.append(0, 127)
    b.append(1, -128)
    b.extend([2], torch.tensor([100]))
    b2 = DynamicSparseTensor(dtype=torch.float16)
    b2.append(0, float("inf"))  # inf and NaN are stored as given
    b2.append(1, float("nan"))
    b2.append(2, 65504.0)
    assert b.build().coalesce().values().tolist() == [127, -128, 100]
    v = b2.build().coalesce().values()
    assert v[0] == float("inf") and v[1].isnan() and v[2] == 65504


def _sparse_batch():
    return torch.tensor([[1.0, 0.0, 2.0, 3.0], [0.0, 4.0, 5.0, 0.0]]).to_sparse_csr()


@pytest.mark.parametrize("make", [
    lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                                         generator=torch.Generator().manual_seed(0)),
    lambda: nnsparse.MaskCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                                   generator=torch.Generator().manual_seed(0)),
])
def test_sparse_criteria_keep_their_mask_after_a_failed_call(make):
    criterion = make()
    x = _sparse_batch()
    criterion.prepare_input(x)
    estimate = torch.arange(8.0).reshape(2, 4)
    before = criterion(estimate, x)
    bad_inputs = [torch.sparse_csr_tensor(torch.tensor([0, 3, 2]), torch.tensor([0, 1, 2]),
                                          torch.ones(3), (2, 4)),  # decreasing row pointers
                  "not a tensor"]
    for bad in bad_inputs:
        with pytest.raises((TypeError, ValueError)):
            criterion.prepare_input(bad)
    with pytest.raises((TypeError, ValueError)):
        criterion(torch.zeros(3, 4), x)  # wrong shape for the remembered mask
    assert torch.equal(criterion(estimate, x), before)


def test_dense_criteria_keep_their_mask_after_a_failed_call():
    for criterion in (nnsparse.SDAECriterion(nn.MSELoss(), hide_ratio=0.5,
                                             generator=torch.Generator().manual_seed(0)),
                      nnsparse.MaskCriterion(nn.MSELoss(), hide_ratio=0.5,
                                             generator=torch.Generator().manual_seed(0))):
        x = torch.arange(8.0).reshape(2, 4)
        criterion.prepare_input(x)
        before = criterion(torch.zeros(2, 4), x)
        with pytest.raises((TypeError, ValueError)):
            criterion.prepare_input(_sparse_batch() if isinstance(
                criterion, nnsparse.SDAECriterion) else torch.zeros(2, 2, 2))
        assert torch.equal(criterion(torch.zeros(2, 4), x), before)


def test_rating_errors_keep_their_sums_after_a_failed_update():
    from nnsparse.data import RatingErrors
    errors = RatingErrors()
    errors.update(torch.tensor([3.0, 4.0]), torch.tensor([4.0, 4.0]))
    before = errors.compute()
    for prediction, target, error in ((torch.ones(3), torch.ones(2), ValueError),
                                      (torch.ones(2).to_sparse(), torch.ones(2), TypeError),
                                      ([1.0, 2.0], torch.ones(2), TypeError)):
        with pytest.raises(error, match="(prediction and target must have one shape|"
                                        "prediction must be a dense tensor)"):
            errors.update(prediction, target)
    assert errors.compute() == before


@pytest.mark.parametrize("make", [
    lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                                         noise_ratio=0.2, generator=torch.Generator().manual_seed(0)),
    lambda: nnsparse.MaskCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                                   generator=torch.Generator().manual_seed(0)),
])
def test_criteria_keep_their_mask_after_the_second_probes_refusals(make):
    """Complex targets, a target on another device, a negative weight set after __init__."""
    criterion = make()
    x = _sparse_batch()
    criterion.prepare_input(x)
    estimate = torch.arange(8.0).reshape(2, 4)
    before = criterion(estimate, x)
    meta = torch.sparse_coo_tensor(torch.tensor([[0], [1]], device="meta"),
                                   torch.ones(1, device="meta"), (2, 4))
    for target, error in ((x.to(torch.complex64), TypeError), (meta, ValueError)):
        with pytest.raises(error, match="target"):
            criterion(estimate, target)
    with pytest.raises(ValueError, match="alpha must be non-negative, got -1.0"):
        criterion.alpha = -1.0  # refused when assigned: the old weight stays
    assert criterion.alpha == 1.0
    assert torch.equal(criterion(estimate, x), before)


def _pair_rows():
    return [torch.tensor([[3.0, 5.0], [1.0, 4.0]]), torch.tensor([[2.0, 9.0], [0.0, 1.0]])]


def _inference(t):
    with torch.inference_mode():
        return t.clone()


@pytest.mark.parametrize("bad, message", [
    (lambda: torch.tensor([[2.0, 9.0]]).expand(2, 2), "an expanded tensor at x\\[2\\]"),
    (lambda: _inference(torch.tensor([[2.0, 9.0]])), "an inference tensor at x\\[2\\]"),
    (lambda: torch.tensor([[2.0, 9.0]], requires_grad=True)[:],
     "a view of a leaf tensor that requires grad at x\\[2\\]"),
])
def test_inplace_sort_refusal_writes_no_row(bad, message):
    """ssort(list, inplace=True) wrote the rows before the one torch refuses to write."""
    rows = _pair_rows() + [bad()]
    before = [r.clone() for r in rows[:2]]
    with pytest.raises(RuntimeError, match=message):
        nnsparse.ssort(rows, inplace=True)
    assert all(torch.equal(r, b) for r, b in zip(rows, before))
    nnsparse.ssort(rows[:2], inplace=True)  # the good rows still sort
    assert rows[0].tolist() == [[1.0, 4.0], [3.0, 5.0]]


def test_pattern_sequential_extend_refusal_adds_nothing():
    """nn.Sequential.extend appended the good items before the bad one."""
    model = nnsparse.PatternSequential(nn.ReLU())
    with pytest.raises(TypeError, match=r"got str 'a' for item '2' \(nothing was added\)"):
        model.extend([nn.Tanh(), "a"])
    assert len(model) == 1 and isinstance(model[0], nn.ReLU)
    model.extend(iter([nn.Tanh()]))  # any iterable, read once
    assert len(model) == 2 and isinstance(model[1], nn.Tanh)
