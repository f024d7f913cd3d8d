"""SDAECriterion and SDAESparseCriterion: corruption, weighting, state and errors."""
import numpy as np
import pytest
import torch
from torch import nn

import nnsparse
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, VECTOR_FORMS, make_form, random_sparse_dense
from nnsparse import SDAECriterion, SDAESparseCriterion, SparseCriterion, densify, prepare_input

LOSSES = {
    "mse": (nn.MSELoss, lambda t: t),
    "l1": (nn.L1Loss, lambda t: t),
    "bce_logits": (nn.BCEWithLogitsLoss, lambda t: t.abs() / 1.5),
}


def _elementwise(criterion, estimate, target):
    reduction, criterion.reduction = criterion.reduction, "none"
    try:
        return criterion(estimate, target)
    finally:
        criterion.reduction = reduction


def _weighted_reference(criterion, estimate, target, corrupted, alpha, beta, keep=None):
    """alpha * sum over corrupted + beta * sum over the others, restricted to keep."""
    losses = _elementwise(criterion, estimate, target)
    weighted = torch.where(corrupted, alpha * losses, beta * losses)
    if keep is not None:
        weighted = weighted[keep]
    return weighted.sum()


# -- SDAECriterion (dense) ----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("size_average", [True, False])
@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_dense_loss_and_gradient_with_prepared_mask(loss_name, size_average, dtype, device):
    make, as_target = LOSSES[loss_name]
    g = torch.Generator(device=device).manual_seed(0)
    clean = as_target(torch.rand(6, 10, dtype=dtype, device=device, generator=g) + 0.5)
    crit = SDAECriterion(make(), alpha=0.8, beta=0.3, noise_ratio=0.2, hide_ratio=0.3,
                         generator=g, size_average=size_average)
    noisy = crit.prepare_input(clean)
    corrupted = noisy != clean
    assert 0 < int(corrupted.sum()) < clean.numel()
    estimate = torch.randn(6, 10, dtype=dtype, device=device, generator=g, requires_grad=True)
    loss = crit(estimate, clean)
    loss.backward()
    ref_estimate = estimate.detach().clone().requires_grad_()
    ref = _weighted_reference(make(), ref_estimate, clean, corrupted, 0.8, 0.3)
    if size_average:
        ref = ref / clean.numel()
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL[dtype])
    torch.testing.assert_close(estimate.grad, ref_estimate.grad, **TOL[dtype])


def test_dense_explicit_mask_needs_no_prepare_input():
    g = torch.Generator().manual_seed(1)
    estimate = torch.randn(3, 4, generator=g, dtype=torch.float64)
    target = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=g) < 0.5
    crit = SDAECriterion(nn.MSELoss(), alpha=2.0, beta=0.5)
    ref = _weighted_reference(nn.MSELoss(), estimate, target, mask, 2.0, 0.5) / 12
    torch.testing.assert_close(crit(estimate, target, mask=mask), ref)


def test_dense_gradcheck():
    g = torch.Generator().manual_seed(2)
    target = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=g) < 0.5
    crit = SDAECriterion(nn.HuberLoss(delta=0.5), alpha=1.5, beta=0.25)
    estimate = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda e: crit(e, target, mask=mask), (estimate,))


def test_lua_dense_no_noise():
    # testSDAECriterion.lua NoNoise: no corruption -> beta times the plain loss and gradient.
    g = torch.Generator().manual_seed(3)
    input = torch.ones(10, 100, dtype=torch.float64)
    output = torch.rand(10, 100, generator=g, dtype=torch.float64)
    crit = SDAECriterion(nn.MSELoss(), alpha=1, beta=0.5, generator=g)
    noisy = crit.prepare_input(input)
    assert torch.equal(noisy, input) and noisy is not input
    out = output.clone().requires_grad_()
    loss = crit(out, noisy)
    loss.backward()
    plain = output.clone().requires_grad_()
    expected = nn.MSELoss()(plain, input) * 0.5
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(out.grad, plain.grad)


def test_lua_dense_with_noise():
    # testSDAECriterion.lua WithNoise: hide 0.3, alpha 0.8, beta 0.3, the formula by hand.
    g = torch.Generator().manual_seed(4)
    input = torch.rand(10, 100, generator=g, dtype=torch.float64) + 0.1
    output = torch.rand(10, 100, generator=g, dtype=torch.float64)
    crit = SDAECriterion(nn.MSELoss(), alpha=0.8, beta=0.3, hide_ratio=0.3, generator=g)
    noisy = crit.prepare_input(input)
    alpha_mask = noisy == 0
    out = output.clone().requires_grad_()
    loss = crit(out, noisy)
    loss.backward()
    diff = (output - noisy) ** 2
    expected = (0.8 * diff[alpha_mask].sum() + 0.3 * diff[~alpha_mask].sum()) / diff.numel()
    torch.testing.assert_close(loss, expected)
    grad = 2 * (output - noisy) * torch.where(alpha_mask, 0.8, 0.3) / diff.numel()
    torch.testing.assert_close(out.grad, grad)


# -- corruption statistics (10^6 entries: a ratio is then within 1% of the asked one
# by 4 standard deviations or more) ----------------------------------------------------
RATIO_TOL = dict(rel=0.01)


def _check_statistics(clean, noisy, corrupted):
    n = clean.numel()
    flip_hi, flip_lo, hide = noisy == 99, noisy == -99, noisy == 0
    gauss = ~(flip_hi | flip_lo | hide | (noisy == clean))
    assert float(flip_hi.sum() + flip_lo.sum()) / n == pytest.approx(0.3, **RATIO_TOL)
    assert float(flip_hi.sum()) / n == pytest.approx(0.15, **RATIO_TOL)
    assert float(flip_lo.sum()) / n == pytest.approx(0.15, **RATIO_TOL)
    assert float(hide.sum()) / n == pytest.approx(0.2, **RATIO_TOL)
    assert float(gauss.sum()) / n == pytest.approx(0.4, **RATIO_TOL)
    noise = (noisy - clean)[gauss]
    assert float(noise.mean()) == pytest.approx(5.0, rel=0.01)
    assert float(noise.std()) == pytest.approx(2.0, rel=0.01)
    assert torch.equal(corrupted, noisy != clean)


MIXTURE = dict(noise_ratio=0.4, noise_mean=5.0, noise_std=2.0, flip_ratio=0.3,
               flip_range=(-99.0, 99.0), hide_ratio=0.2)


def test_dense_corruption_statistics():
    clean = torch.ones(1000, 1000, dtype=torch.float64)
    crit = SDAECriterion(nn.MSELoss(), generator=torch.Generator().manual_seed(5), **MIXTURE)
    noisy = crit.prepare_input(clean)
    # the remembered mask, read back through an explicit-mask-free loss with alpha=1, beta=0
    _check_statistics(clean, noisy, crit._mask)


def test_sparse_corruption_statistics():
    clean = torch.ones(200, 10000, dtype=torch.float64)
    clean[torch.rand(200, 10000, generator=torch.Generator().manual_seed(6)) < 0.5] = 0
    sparse = clean.to_sparse()
    crit = SDAESparseCriterion(nn.MSELoss(), generator=torch.Generator().manual_seed(7), **MIXTURE)
    noisy = crit.prepare_input(sparse)
    n = sparse._nnz()
    assert n > 10 ** 6 - 10 ** 4
    # hidden entries keep their position with the value 0: the pattern is the input's
    assert torch.equal(noisy._indices(), sparse.coalesce()._indices())
    assert float((noisy.values() == 0).sum()) / n == pytest.approx(0.2, **RATIO_TOL)
    # every entry's corrupted value, row-major like the remembered flags
    per_entry = densify(noisy, size=tuple(clean.shape))[clean != 0]
    _check_statistics(torch.ones(n, dtype=torch.float64), per_entry, crit._mask.flag)


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_same_seed_same_corruption(criterion_class):
    clean = random_sparse_dense(20, 30, 0.5)
    x = clean if criterion_class is SDAECriterion else clean.to_sparse()
    runs = []
    for seed in (11, 11, 12):
        crit = criterion_class(nn.MSELoss(), generator=torch.Generator().manual_seed(seed),
                               noise_ratio=0.3, flip_ratio=0.2, hide_ratio=0.2)
        out = crit.prepare_input(x)
        runs.append(out if criterion_class is SDAECriterion else densify(out))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_global_generator_by_default():
    torch.manual_seed(13)
    a = SDAECriterion(nn.MSELoss(), hide_ratio=0.5).prepare_input(torch.ones(50))
    torch.manual_seed(13)
    b = SDAECriterion(nn.MSELoss(), hide_ratio=0.5).prepare_input(torch.ones(50))
    assert torch.equal(a, b)


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
@pytest.mark.parametrize("ratios, message", [
    (dict(noise_ratio=0.5, flip_ratio=0.4, hide_ratio=0.2),
     r"noise_ratio \+ flip_ratio \+ hide_ratio must be at most 1, got 0.5 \+ 0.4 \+ 0.2"),
])
def test_ratios_summing_above_one(criterion_class, ratios, message):
    with pytest.raises(ValueError, match=message):
        criterion_class(nn.MSELoss(), **ratios)
    crit = criterion_class(nn.MSELoss())
    for key, value in ratios.items():  # each is valid alone: the sum is checked at use
        setattr(crit, key, value)
    with pytest.raises(ValueError, match=message):
        crit.prepare_input(torch.ones(2, 2) if criterion_class is SDAECriterion
                           else torch.ones(2, 2).to_sparse())


_NAN = float("nan")


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
@pytest.mark.parametrize("name, value, error, message", [
    ("hide_ratio", -0.1, ValueError, r"hide_ratio must be in \[0, 1\], got -0.1"),
    ("hide_ratio", _NAN, ValueError, "hide_ratio must be finite, got nan"),
    ("hide_ratio", "0.5", TypeError, "hide_ratio must be a real number, got str '0.5'"),
    ("noise_ratio", 1.5, ValueError, r"noise_ratio must be in \[0, 1\], got 1.5"),
    ("flip_ratio", True, TypeError, "flip_ratio must be a real number, got bool"),
    ("flip_range", (1.0,), ValueError, r"flip_range must hold 2 values, got \(1.0,\)"),
    ("flip_range", 3, TypeError, "flip_range must be a pair"),
    ("flip_range", (0.0, _NAN), ValueError, "flip_range must be finite, got nan"),
    ("noise_std", -1.0, ValueError, "noise_std must be non-negative, got -1.0"),
    ("noise_mean", float("inf"), ValueError, "noise_mean must be finite, got inf"),
    ("alpha", -1.0, ValueError, "alpha must be non-negative, got -1.0"),
    ("beta", _NAN, ValueError, "beta must be finite, got nan"),
    ("alpha", torch.tensor(1.0), TypeError, "alpha must be a real number, got Tensor"),
    ("generator", 0, TypeError, "generator must be a torch.Generator or None, got int"),
    ("size_average", "no", TypeError, "size_average must be a bool, got str 'no'"),
])
def test_bad_settings_refused_as_arguments_and_when_assigned(criterion_class, name, value, error,
                                                            message):
    with pytest.raises(error, match=message):
        criterion_class(nn.MSELoss(), **{name: value})
    crit = criterion_class(nn.MSELoss(), alpha=0.5, beta=0.25, hide_ratio=0.5)
    before = getattr(crit, name)
    with pytest.raises(error, match=message):
        setattr(crit, name, value)
    assert getattr(crit, name) == before  # a refused assignment keeps the old value


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_assigned_settings_are_used(criterion_class):
    # Lua's SetAlpha / SetBeta: crit.alpha = a
    crit = criterion_class(nn.MSELoss())
    crit.alpha, crit.beta, crit.flip_range = 2, np.float64(0.5), torch.tensor([0.0, 1.0])
    assert (crit.alpha, crit.beta, crit.flip_range) == (2.0, 0.5, (0.0, 1.0))
    assert type(crit.alpha) is float and type(crit.beta) is float
    x = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    mask = torch.tensor([[True, False, False, False]])
    est = torch.zeros(1, 4)
    target = x if criterion_class is SDAECriterion else x.to_sparse()
    # alpha * (0 - 1)**2 at the masked entry, beta * (0 - 2)**2 at the other specified one,
    # divided by the estimate's 4 entries (dense) or the target's 2 (sparse)
    expected = (2.0 * 1.0 + 0.5 * 4.0) / (4 if criterion_class is SDAECriterion else 2)
    torch.testing.assert_close(crit(est, target, mask=mask), torch.tensor(expected))


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_size_average_assigned_against_a_sum_loss(criterion_class):
    crit = criterion_class(nn.MSELoss(reduction="sum"))
    crit.size_average = True  # a bool: accepted; it contradicts the loss, refused at use
    target = torch.ones(1, 2) if criterion_class is SDAECriterion else torch.ones(1, 2).to_sparse()
    with pytest.raises(ValueError, match="reduction='sum' contradicts size_average=True"):
        crit(torch.zeros(1, 2), target, mask=torch.ones(1, 2, dtype=torch.bool))


def test_dense_errors():
    crit = SDAECriterion(nn.MSELoss(), hide_ratio=0.5)
    with pytest.raises(ValueError, match="no corruption mask: call prepare_input"):
        crit(torch.zeros(2, 3), torch.zeros(2, 3))
    crit.prepare_input(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"prepare_input was given a batch of shape \(2, 3\), "
                                         r"the estimate has shape \(4, 3\)"):
        crit(torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"target has shape \(2, 2\), estimate has \(2, 3\)"):
        crit(torch.zeros(2, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"mask must have the estimate's shape \(2, 3\), got \(3,\)"):
        crit(torch.zeros(2, 3), torch.zeros(2, 3), mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        crit(torch.zeros(2, 3), torch.zeros(2, 3), mask=torch.ones(2, 3))
    with pytest.raises(TypeError, match="use SDAESparseCriterion for sparse data"):
        crit.prepare_input(torch.ones(2, 3).to_sparse())
    with pytest.raises(TypeError, match="needs a dense target"):
        crit(torch.zeros(2, 3), torch.ones(2, 3).to_sparse())
    with pytest.raises(ValueError, match="target is on meta, estimate on cpu"):
        crit(torch.zeros(2, 3), torch.zeros(2, 3, device="meta"))


# -- SDAESparseCriterion ------------------------------------------------------------------
def _dense_of_form(x, width, rows=None):
    size = width if rows is None else (rows, width)
    return densify(x, size=size)


@pytest.mark.parametrize("form", BATCH_FORMS)
def test_sparse_prepare_input_keeps_form_and_pattern_hides_by_zero(form):
    clean = random_sparse_dense(8, 12, 0.5, empty_rows=1)
    x = make_form(clean, form)
    crit = SDAESparseCriterion(nn.MSELoss(), hide_ratio=0.4, noise_ratio=0.2,
                               generator=torch.Generator().manual_seed(8))
    noisy = crit.prepare_input(x)
    if isinstance(x, torch.Tensor):
        assert noisy.layout == x.layout and noisy.shape == x.shape
    else:
        assert isinstance(noisy, list) and len(noisy) == len(x)
        assert all(type(a) is type(b) and a.layout == b.layout for a, b in zip(noisy, x))
    dense_noisy = _dense_of_form(noisy, 12, 8)
    specified = clean != 0
    # hidden entries hold 0 at their position, nothing appears, nothing is removed
    hidden = specified & (dense_noisy == 0)
    assert 0 < int(hidden.sum()) < int(specified.sum())
    assert torch.all(dense_noisy[~specified] == 0)
    nnz = noisy._nnz() if isinstance(noisy, torch.Tensor) else sum(
        r._nnz() if r.layout == torch.sparse_coo else r.shape[0] for r in noisy)
    assert nnz == int(specified.sum())
    if form == "csr":  # the input's own index tensors: its checked structure is shared
        assert noisy.crow_indices() is x.crow_indices() or torch.equal(
            noisy.crow_indices(), x.crow_indices())
        assert noisy.col_indices().data_ptr() == x.col_indices().data_ptr()


@pytest.mark.parametrize("form", VECTOR_FORMS)
def test_sparse_prepare_input_on_a_vector(form):
    clean = random_sparse_dense(1, 30, 0.5)[0]
    x = make_form(clean, form)
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5,
                               generator=torch.Generator().manual_seed(9))
    if form == "pairs":
        # a strided tensor is dense in criteria: a Lua pair vector goes through from_pairs
        with pytest.raises(TypeError, match=r"input must be sparse.*from_pairs"):
            crit.prepare_input(x)
        x = nnsparse.from_pairs(x, size=30)
    noisy = crit.prepare_input(x)
    assert isinstance(noisy, torch.Tensor) and noisy.layout == x.layout
    dense_noisy = densify(noisy, size=30)
    corrupted = (clean != 0) & (dense_noisy != clean)
    estimate = torch.randn(30, dtype=torch.float64, requires_grad=True)
    loss = crit(estimate, x)
    ref = _weighted_reference(nn.MSELoss(), estimate.detach(), clean, corrupted, 1.0, 0.5,
                              keep=clean != 0) / int((clean != 0).sum())
    torch.testing.assert_close(loss, ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("size_average", [True, False])
@pytest.mark.parametrize("loss_name", list(LOSSES))
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_sparse_loss_and_gradient(form, loss_name, size_average, dtype, device):
    make, as_target = LOSSES[loss_name]
    clean = as_target(random_sparse_dense(7, 11, 0.5, dtype=dtype, device=device, empty_rows=1))
    x = make_form(clean, form)
    clean = densify(x, size=(7, 11))  # duplicates summed, as the criterion sees them
    g = torch.Generator(device=device).manual_seed(10)
    crit = SDAESparseCriterion(make(), alpha=0.8, beta=0.3, noise_ratio=0.25, hide_ratio=0.25,
                               generator=g, size_average=size_average)
    noisy = densify(crit.prepare_input(x), size=(7, 11))
    specified = clean != 0
    corrupted = specified & (noisy != clean)
    assert 0 < int(corrupted.sum()) < int(specified.sum())
    estimate = torch.randn(7, 11, dtype=dtype, device=device, requires_grad=True)
    loss = crit(estimate, x)
    loss.backward()
    ref_estimate = estimate.detach().clone().requires_grad_()
    ref = _weighted_reference(make(), ref_estimate, clean, corrupted, 0.8, 0.3, keep=specified)
    if size_average:
        ref = ref / int(specified.sum())
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL[dtype])
    torch.testing.assert_close(estimate.grad, ref_estimate.grad, **TOL[dtype])
    # an explicit mask gives the same result
    torch.testing.assert_close(crit(estimate, x, mask=corrupted), loss.detach(), **TOL[dtype])


@pytest.mark.parametrize("target_form", BATCH_FORMS)
def test_sparse_mask_follows_entries_not_order(target_form):
    clean = random_sparse_dense(6, 9, 0.6, empty_rows=1)
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.2, hide_ratio=0.5,
                               generator=torch.Generator().manual_seed(14))
    crit.prepare_input(make_form(clean, "coo"))
    estimate = torch.randn(6, 9, dtype=torch.float64)
    expected = crit(estimate, make_form(clean, "coo"))
    torch.testing.assert_close(crit(estimate, make_form(clean, target_form)), expected,
                               rtol=1e-12, atol=1e-12)


def test_sparse_target_entry_not_in_prepared_input_counts_as_not_corrupted():
    x = torch.tensor([[1.0, 0.0, 2.0]]).to_sparse()
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=1.0,
                               size_average=False)
    crit.prepare_input(x)  # both entries hidden (corrupted)
    target = torch.tensor([[1.0, 3.0, 2.0]]).to_sparse()
    loss = crit(torch.zeros(1, 3), target)
    assert loss.item() == pytest.approx(1.0 + 0.5 * 9.0 + 4.0)


def test_lua_sparse_no_noise():
    # testSDAESparseCriterion.lua NoNoise: beta times the plain loss and gradient.
    g = torch.Generator().manual_seed(15)
    input = torch.ones(10, 100, dtype=torch.float64)
    output = torch.rand(10, 100, generator=g, dtype=torch.float64)
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=1, beta=0.5, generator=g)
    noisy = crit.prepare_input(nnsparse.sparsify(input))
    out = output.clone().requires_grad_()
    loss = crit(out, noisy)
    loss.backward()
    plain = output.clone().requires_grad_()
    expected = nn.MSELoss()(plain, input) * 0.5
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.grad, plain.grad, rtol=1e-12, atol=1e-12)


def test_lua_sparse_with_noise():
    # testSDAESparseCriterion.lua WithNoise: hide 0.3, alpha 0.8, beta 0.3, over the
    # specified entries, divided by their number.
    g = torch.Generator().manual_seed(16)
    input = torch.rand(10, 100, generator=g, dtype=torch.float64) + 0.1
    input[torch.rand(10, 100, generator=g) < 0.6] = 0
    output = torch.rand(10, 100, generator=g, dtype=torch.float64)
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=0.8, beta=0.3, hide_ratio=0.3, generator=g)
    sparse = nnsparse.sparsify(input)
    noisy = densify(crit.prepare_input(sparse))
    mask = input != 0
    alpha_mask = (noisy == 0)[mask]
    out = output.clone().requires_grad_()
    loss = crit(out, sparse)
    loss.backward()
    diff = (output[mask] - input[mask]) ** 2
    expected = (0.8 * diff[alpha_mask].sum() + 0.3 * diff[~alpha_mask].sum()) / diff.numel()
    torch.testing.assert_close(loss, expected)
    grad = torch.zeros_like(output)
    grad[mask] = 2 * (output[mask] - input[mask]) * torch.where(alpha_mask, 0.8, 0.3) / diff.numel()
    torch.testing.assert_close(out.grad, grad)


@pytest.mark.parametrize("pattern", ["equal", "containing"])
@pytest.mark.parametrize("estimate_layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_estimate_matches_dense_estimate(pattern, estimate_layout):
    g = torch.Generator().manual_seed(17)
    clean = random_sparse_dense(6, 10, 0.4, generator=g, empty_rows=1)
    target = make_form(clean, "coo_uncoalesced")
    crit = SDAESparseCriterion(nn.MSELoss(), alpha=0.9, beta=0.4, hide_ratio=0.3,
                               generator=torch.Generator().manual_seed(18))
    crit.prepare_input(target)
    pattern_dense = clean.clone()
    if pattern == "containing":
        pattern_dense[torch.rand(6, 10, generator=g) < 0.3] = 1.0
    index = pattern_dense.nonzero().t()
    estimate_data = torch.randn(6, 10, generator=g, dtype=torch.float64)
    values = estimate_data[index[0], index[1]].clone().requires_grad_()
    sparse = torch.sparse_coo_tensor(index, values, (6, 10), is_coalesced=True)
    if estimate_layout == torch.sparse_csr:
        crow = torch.zeros(7, dtype=torch.long)
        crow[1:] = torch.bincount(index[0], minlength=6).cumsum(0)
        sparse = torch.sparse_csr_tensor(crow, index[1], values, (6, 10))
    loss = crit(sparse, target)
    loss.backward()
    dense = estimate_data.clone().requires_grad_()
    expected = crit(dense, target)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(values.grad, dense.grad[index[0], index[1]], rtol=0, atol=1e-12)


def test_sparse_gradcheck():
    x = make_form(random_sparse_dense(3, 5, 0.6), "csr")
    crit = SDAESparseCriterion(nn.SmoothL1Loss(beta=0.5), alpha=1.5, beta=0.5, hide_ratio=0.5,
                               generator=torch.Generator().manual_seed(19))
    crit.prepare_input(x)
    estimate = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda e: crit(e, x), (estimate,))


def test_sparse_errors():
    crit = SDAESparseCriterion(nn.MSELoss(), hide_ratio=0.5)
    x = torch.ones(2, 3).to_sparse()
    with pytest.raises(ValueError, match="no corruption mask: call prepare_input"):
        crit(torch.zeros(2, 3), x)
    crit.prepare_input(x)
    with pytest.raises(ValueError, match=r"SDAESparseCriterion.prepare_input was given a batch of "
                                         r"shape \(2, 3\), the estimate of shape \(4, 3\) does not"):
        crit(torch.zeros(4, 3), torch.ones(4, 3).to_sparse())
    with pytest.raises(ValueError, match=r"shape \(2, 3\), the estimate of shape \(2, 5\) does not"):
        crit(torch.zeros(2, 5), torch.ones(2, 5).to_sparse())
    with pytest.raises(ValueError, match=r"mask must have the estimate's shape \(2, 3\), got \(2, 2\)"):
        crit(torch.zeros(2, 3), x, mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"target has 1 rows, estimate of shape \(2, 3\) has 2"):
        crit(torch.zeros(2, 3), torch.ones(1, 3).to_sparse())
    with pytest.raises(ValueError, match="target is on cpu, estimate on meta"):
        crit(torch.zeros(2, 3, device="meta"), x)


def test_pair_input_with_inferred_width_matches_a_wider_estimate():
    # A pair list only says "largest index + 1": a wider estimate is fine.
    x = [torch.tensor([[0.0, 1.0], [2.0, 3.0]]), torch.tensor([[1.0, 2.0]])]
    crit = SDAESparseCriterion(nn.MSELoss(), beta=1.0, size_average=False)
    crit.prepare_input(x)
    assert crit(torch.zeros(2, 5), x).item() == pytest.approx(1 + 9 + 4)


# -- one training loop for every criterion ---------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: nn.MSELoss(),
    lambda: SparseCriterion(nn.MSELoss()),
    lambda: SDAESparseCriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.25,
                                generator=torch.Generator().manual_seed(20)),
])
def test_one_loop_serves_every_criterion(make):
    criterion = make()
    torch.manual_seed(0)
    net = nn.Linear(6, 6).double()
    data = random_sparse_dense(4, 6, 0.5)
    target = data if isinstance(criterion, nn.MSELoss) else data.to_sparse()
    for _ in range(2):
        x = prepare_input(criterion, target)
        dense_x = x if not isinstance(x, torch.Tensor) or x.layout == torch.strided else x.to_dense()
        loss = criterion(net(dense_x), target)
        loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
@pytest.mark.parametrize("dtype, flip_range, message", [
    (torch.uint8, (-1.0, 1.0), r"flip_range must hold values the input's dtype torch.uint8 can "
                               r"hold \(integers in \[0, 255\]\), got \(-1.0, 1.0\)"),
    (torch.int64, (0.5, 0.5), r"dtype torch.int64 can hold \(integers in .*got \(0.5, 0.5\)"),
    (torch.int8, (0.0, 300.0), r"dtype torch.int8 can hold \(integers in \[-128, 127\]\)"),
    (torch.float16, (0.0, 1e6), r"dtype torch.float16 can hold \(values in \[-65504.0, 65504.0\]\)"),
], ids=["uint8-negative", "int64-fraction", "int8-beyond", "float16-beyond"])
def test_flip_range_refused_for_the_input_dtype(criterion_class, dtype, flip_range, message):
    crit = criterion_class(nn.MSELoss(), flip_ratio=0.5, flip_range=flip_range)
    x = torch.tensor([[1, 2, 0, 3]], dtype=dtype)
    with pytest.raises(ValueError, match=message):
        crit.prepare_input(x if criterion_class is SDAECriterion else x.to_sparse())
    assert crit.mask_alpha is None  # refused before anything was remembered


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_integer_flip_range_on_integer_values(criterion_class):
    g = torch.Generator().manual_seed(0)
    crit = criterion_class(nn.MSELoss(), flip_ratio=1.0, flip_range=(0, 5), generator=g)
    x = torch.tensor([[1, 2, 4, 3]], dtype=torch.uint8)
    out = crit.prepare_input(x if criterion_class is SDAECriterion else x.to_sparse())
    values = out if criterion_class is SDAECriterion else out.coalesce().values()
    assert values.dtype == torch.uint8 and set(values.flatten().tolist()) <= {0, 5}


@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_integer_estimate_and_target_are_promoted(criterion_class):
    crit = criterion_class(nn.MSELoss(), alpha=1.0, beta=0.5)
    estimate = torch.tensor([[1, 1, 0]])
    target = torch.tensor([[0, 2, 0]])
    mask = torch.tensor([[True, False, False]])
    if criterion_class is SDAESparseCriterion:
        target = target.to_sparse()
    loss = crit(estimate, target, mask=mask)
    assert loss.dtype == torch.get_default_dtype()
    torch.testing.assert_close(loss, crit(estimate.float(), target.float(), mask=mask))


@pytest.mark.parametrize("default", [torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("criterion_class", [SDAECriterion, SDAESparseCriterion])
def test_the_corruption_draws_in_float32_whatever_the_default_dtype(criterion_class, default,
                                                                   same_draws_under):
    # the fate and flip draws took torch's default dtype: another corruption for a seed, and
    # under bfloat16 10.2 % of draws below 0.1 (probe 18)
    same_draws_under(lambda x: criterion_class(
        nn.MSELoss(), noise_ratio=0.2, noise_std=0.1, flip_ratio=0.2, flip_range=(-1.0, 1.0),
        hide_ratio=0.2, generator=torch.Generator().manual_seed(1)).prepare_input(x),
        default, criterion_class is SDAESparseCriterion)
