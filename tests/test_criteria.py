"""SparseCriterion, the element-wise loss wrapper and prepare_input."""
import re

import pytest
import torch
from torch import nn

import nnsparse
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, VECTOR_FORMS, make_form, random_sparse_dense
from nnsparse import SparseCriterion, prepare_input

AVERAGING = [(True, False), (False, True), (False, False)]
AVERAGING_IDS = ["size_average", "full_size_average", "sum"]


def _loss(name, width):
    """(criterion, map from the dense target to the values the loss expects)."""
    if name == "mse":
        return nn.MSELoss(), lambda t: t
    if name == "l1":
        return nn.L1Loss(), lambda t: t
    if name == "bce_logits":
        return nn.BCEWithLogitsLoss(), lambda t: t.abs() / 1.5
    if name == "bce_logits_pos_weight":
        pos_weight = torch.linspace(0.5, 2.0, width, dtype=torch.float64)
        return nn.BCEWithLogitsLoss(pos_weight=pos_weight), lambda t: t.abs() / 1.5
    if name == "smooth_l1":
        return nn.SmoothL1Loss(beta=0.3), lambda t: t
    if name == "huber":
        return nn.HuberLoss(delta=0.4), lambda t: t
    raise ValueError(name)


def _reference(criterion, estimate, dense_target, size_average, full_size_average):
    """The dense masked computation: the loss at the nonzero entries of the target."""
    specified = dense_target != 0
    losses = _elementwise_reference(criterion, estimate, dense_target)[specified]
    loss = losses.sum()
    if size_average:
        return loss / max(int(specified.sum()), 1)
    if full_size_average:
        return loss / estimate.numel()
    return loss


def _elementwise_reference(criterion, estimate, target):
    # The module itself on dense tensors, with reduction='none' (pos_weight broadcasts).
    reduction = criterion.reduction
    criterion.reduction = "none"
    try:
        return criterion(estimate, target)
    finally:
        criterion.reduction = reduction


def _check(crit, criterion, estimate_data, dense_target, target, tol, averaging):
    estimate = estimate_data.clone().requires_grad_()
    loss = crit(estimate, target)
    loss.backward()
    ref_estimate = estimate_data.clone().requires_grad_()
    ref = _reference(criterion, ref_estimate, dense_target, *averaging)
    ref.backward()
    assert loss.shape == ()
    assert loss.dtype == estimate.dtype
    torch.testing.assert_close(loss, ref, **tol)
    torch.testing.assert_close(estimate.grad, ref_estimate.grad, **tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("averaging", AVERAGING, ids=AVERAGING_IDS)
@pytest.mark.parametrize("loss_name", ["mse", "l1", "bce_logits"])
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_batch_matches_dense_masked_reference(form, loss_name, averaging, dtype, device):
    g = torch.Generator().manual_seed(3)
    raw = random_sparse_dense(6, 9, 0.4, dtype=dtype, device=device, generator=g, empty_rows=1)
    criterion, as_target = _loss(loss_name, 9)
    dense_target = as_target(raw)
    estimate = torch.randn(6, 9, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    crit = SparseCriterion(criterion, *averaging)
    _check(crit, criterion, estimate, dense_target, make_form(dense_target, form), TOL[dtype], averaging)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("averaging", AVERAGING, ids=AVERAGING_IDS)
@pytest.mark.parametrize("loss_name", ["mse", "l1", "bce_logits"])
@pytest.mark.parametrize("form", VECTOR_FORMS)
def test_vector_matches_dense_masked_reference(form, loss_name, averaging, device):
    g = torch.Generator().manual_seed(4)
    raw = random_sparse_dense(1, 12, 0.5, device=device, generator=g)[0]
    criterion, as_target = _loss(loss_name, 12)
    dense_target = as_target(raw)
    estimate = torch.randn(12, generator=g, dtype=torch.float64).to(device)
    crit = SparseCriterion(criterion, *averaging)
    target = make_form(dense_target, form)
    _check(crit, criterion, estimate, dense_target, target, TOL[torch.float64], averaging)
    if form == "pairs":
        # Lua's one-sample call: a lone (k, 2) target of a vector estimate is a pair
        # vector, the same as from_pairs gives
        _check(crit, criterion, estimate, dense_target, nnsparse.from_pairs(target, size=12),
               TOL[torch.float64], averaging)


@pytest.mark.parametrize("loss_name", ["smooth_l1", "huber", "bce_logits_pos_weight"])
@pytest.mark.parametrize("form", ["coo", "pair_list"])
def test_settings_of_the_wrapped_loss_are_kept(form, loss_name):
    g = torch.Generator().manual_seed(5)
    raw = random_sparse_dense(5, 7, 0.5, generator=g)
    criterion, as_target = _loss(loss_name, 7)
    dense_target = as_target(raw)
    estimate = torch.randn(5, 7, generator=g, dtype=torch.float64)
    crit = SparseCriterion(criterion)
    _check(crit, criterion, estimate, dense_target, make_form(dense_target, form),
           TOL[torch.float64], (True, False))


def test_bce_weight_is_read_per_entry():
    g = torch.Generator().manual_seed(6)
    dense_target = random_sparse_dense(4, 5, 0.6, generator=g).abs() / 1.5
    weight = torch.rand(4, 5, generator=g, dtype=torch.float64)
    criterion = nn.BCELoss(weight=weight)
    estimate = torch.rand(4, 5, generator=g, dtype=torch.float64) * 0.8 + 0.1
    _check(SparseCriterion(criterion), criterion, estimate, dense_target,
           make_form(dense_target, "csr"), TOL[torch.float64], (True, False))


def test_weight_that_does_not_broadcast_is_rejected():
    crit = SparseCriterion(nn.BCEWithLogitsLoss(pos_weight=torch.ones(3)))
    target = torch.tensor([[0., 1.], [1., 0.]]).to_sparse()
    with pytest.raises(ValueError, match=r"BCEWithLogitsLoss.pos_weight must broadcast to the "
                                         r"estimate's shape \(2, 2\), got shape \(3,\)"):
        crit(torch.zeros(2, 2), target)


def test_reduction_of_the_wrapped_loss_is_ignored_and_kept():
    criterion = nn.MSELoss(reduction="mean")
    crit = SparseCriterion(criterion, size_average=False)
    target = torch.tensor([[0., 2.], [3., 0.]]).to_sparse()
    loss = crit(torch.zeros(2, 2), target)
    assert loss.item() == pytest.approx(13.0)
    assert criterion.reduction == "mean"


# -- the Lua test suite (testSparseCriterion.lua) ----------------------------------------
def _lua_data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    input = torch.rand(shape, generator=g, dtype=torch.float64)
    input[torch.rand(shape, generator=g) < 0.6] = 0
    output = torch.rand(shape, generator=g, dtype=torch.float64)
    return input, output


def test_lua_one_sample():
    input, output = _lua_data((100,), 10)
    mask = input != 0
    out = output.clone().requires_grad_()
    loss = SparseCriterion(nn.MSELoss())(out, nnsparse.sparsify(input))
    loss.backward()
    sel = output[mask].clone().requires_grad_()
    expected = nn.MSELoss()(sel, input[mask])
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(out.grad[mask], sel.grad)
    assert torch.all(out.grad[~mask] == 0)


@pytest.mark.parametrize("size_average", [True, False], ids=["mini_batch", "no_size_average"])
def test_lua_mini_batch(size_average):
    input, output = _lua_data((10, 100), 11)
    mask = input != 0
    out = output.clone().requires_grad_()
    loss = SparseCriterion(nn.MSELoss(), size_average=size_average)(out, nnsparse.sparsify(input))
    loss.backward()
    sel = output[mask].clone().requires_grad_()
    expected = nn.MSELoss(reduction="mean" if size_average else "sum")(sel, input[mask])
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(out.grad[mask], sel.grad)


def test_lua_full_size_average():
    # Lua's gradient divides by estimate:nElement(); so does the loss here.
    input, output = _lua_data((10, 100), 12)
    mask = input != 0
    out = output.clone().requires_grad_()
    crit = SparseCriterion(nn.MSELoss(), size_average=False, full_size_average=True)
    loss = crit(out, nnsparse.sparsify(input))
    loss.backward()
    torch.testing.assert_close(loss, ((output - input)[mask] ** 2).sum() / 1000)
    torch.testing.assert_close(out.grad, torch.where(mask, 2 * (output - input) / 1000, 0.0))


def test_both_averaging_modes_raise():
    with pytest.raises(ValueError, match="size_average and full_size_average cannot both be True"):
        SparseCriterion(nn.MSELoss(), size_average=True, full_size_average=True)
    crit = SparseCriterion(nn.MSELoss())
    crit.full_size_average = True
    with pytest.raises(ValueError, match="cannot both be True"):
        crit(torch.zeros(2), torch.tensor([[0.0, 1.0]]))


@pytest.mark.parametrize("name, value, error, message", [
    ("size_average", "no", TypeError, "size_average must be a bool, got str 'no'"),
    ("size_average", 1, TypeError, "size_average must be a bool, got int 1"),
    ("full_size_average", None, TypeError, "full_size_average must be a bool, got NoneType"),
])
def test_flags_refused_when_assigned(name, value, error, message):
    crit = SparseCriterion(nn.MSELoss())
    before = getattr(crit, name)
    with pytest.raises(error, match=message):
        setattr(crit, name, value)
    assert getattr(crit, name) == before  # a refused assignment keeps the old value
    estimate, target = torch.zeros(1, 2), torch.tensor([[0.0, 2.0]]).to_sparse()
    torch.testing.assert_close(crit(estimate, target), torch.tensor(4.0))


@pytest.mark.parametrize("assign, message", [
    (dict(size_average=True), "reduction='sum' contradicts size_average=True"),
    (dict(full_size_average=True), "reduction='sum' contradicts full_size_average=True"),
])
def test_flags_assigned_against_a_sum_loss_refused_at_use(assign, message):
    crit = SparseCriterion(nn.MSELoss(reduction="sum"))
    for name, value in assign.items():
        setattr(crit, name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        crit(torch.zeros(1, 2), torch.tensor([[0.0, 2.0]]).to_sparse())


def test_criterion_assigned_later_is_used_and_checked():
    crit = SparseCriterion(nn.MSELoss())
    estimate, target = torch.zeros(1, 2), torch.tensor([[0.0, 2.0]]).to_sparse()
    crit.criterion = nn.L1Loss()
    torch.testing.assert_close(crit(estimate, target), torch.tensor(2.0))
    crit.criterion = nn.CrossEntropyLoss()
    with pytest.raises(TypeError, match="criterion CrossEntropyLoss has no element-wise form"):
        crit(estimate, target)
    crit.criterion = nn.MSELoss(reduction="none")
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'"):
        crit(estimate, target)


_INT_LOSSES = [nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.SoftMarginLoss]


@pytest.mark.parametrize("target_dtype, result_dtype", [
    (torch.int64, torch.float32), (torch.int32, torch.float32), (torch.uint8, torch.float32),
    (torch.float32, torch.float32), (torch.float64, torch.float64),
], ids=["int64", "int32", "uint8", "float32", "float64"])
@pytest.mark.parametrize("estimate_dtype", [torch.int64, torch.int16, torch.bool])
@pytest.mark.parametrize("make_loss", _INT_LOSSES, ids=[c.__name__ for c in _INT_LOSSES])
def test_integer_estimate_is_promoted(make_loss, estimate_dtype, target_dtype, result_dtype):
    estimate = torch.tensor([[1, 0, 1], [0, 1, 1]]).to(estimate_dtype)
    target = torch.tensor([[0, 2, 0], [1, 0, 3]]).to(target_dtype).to_sparse()
    loss = SparseCriterion(make_loss())(estimate, target)
    assert loss.dtype == result_dtype
    reference = SparseCriterion(make_loss())(estimate.to(result_dtype), target.to(result_dtype))
    torch.testing.assert_close(loss, reference)


# -- edge cases ---------------------------------------------------------------------
def test_empty_target_gives_zero_and_zero_gradient():
    estimate = torch.randn(3, 4, requires_grad=True)
    target = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (3, 4))
    loss = SparseCriterion(nn.MSELoss())(estimate, target)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.all(estimate.grad == 0)


def test_batch_of_one_row_and_gradient_to_target_values():
    estimate = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    values = torch.tensor([0.5, 4.0], requires_grad=True)
    target = torch.sparse_coo_tensor(torch.tensor([[0, 0], [0, 2]]), values, (1, 3)).coalesce()
    loss = SparseCriterion(nn.MSELoss())(estimate, target)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([-0.5, 1.0]))  # (t - e) / 2 * 2


def test_gradcheck_float64():
    target = make_form(random_sparse_dense(3, 5, 0.5), "coo_uncoalesced")
    crit = SparseCriterion(nn.SmoothL1Loss(beta=0.5))
    estimate = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda e: crit(e, target), (estimate,))


def test_prepare_input_is_the_identity_and_the_function_dispatches():
    x = torch.ones(2, 3).to_sparse()
    crit = SparseCriterion(nn.MSELoss())
    assert crit.prepare_input(x) is x
    assert prepare_input(crit, x) is x
    assert prepare_input(nn.MSELoss(), x) is x

    class Denoising(nn.Module):
        def prepare_input(self, x):
            return x * 0

    assert torch.equal(prepare_input(Denoising(), torch.ones(2)), torch.zeros(2))


# -- a sparse estimate (a sparse-output decoder's output) ---------------------------------
def _sparse_estimate(values_dense, pattern_dense, form):
    """A leaf values tensor and a sparse estimate built on it, with the pattern of pattern_dense."""
    index = pattern_dense.nonzero().t()
    values = values_dense[index[0], index[1]].clone().requires_grad_()
    shape = tuple(pattern_dense.shape)
    coo = torch.sparse_coo_tensor(index, values, shape, is_coalesced=True)
    if form == "coo":
        return values, coo
    if form == "coo_uncoalesced":
        shuffle = torch.randperm(values.shape[0], generator=torch.Generator().manual_seed(2))
        return values, torch.sparse_coo_tensor(index[:, shuffle], values[shuffle], shape)
    if form == "csr":
        crow = torch.zeros(shape[0] + 1, dtype=torch.long)
        crow[1:] = torch.bincount(index[0], minlength=shape[0]).cumsum(0)
        return values, torch.sparse_csr_tensor(crow, index[1], values, shape)
    if form == "list":
        rows = [torch.sparse_coo_tensor(index[1:, index[0] == r], values[index[0] == r], shape[1:])
                for r in range(shape[0])]
        return values, rows
    raise ValueError(form)


@pytest.mark.parametrize("estimate_form", ["coo", "coo_uncoalesced", "csr", "list"])
@pytest.mark.parametrize("target_form", BATCH_FORMS)
@pytest.mark.parametrize("pattern", ["equal", "containing"])
@pytest.mark.parametrize("loss_name", ["mse", "bce_logits"])
def test_sparse_estimate_matches_dense_estimate(pattern, target_form, estimate_form, loss_name):
    g = torch.Generator().manual_seed(7)
    raw = random_sparse_dense(5, 8, 0.4, generator=g, empty_rows=1)
    criterion, as_target = _loss(loss_name, 8)
    dense_target = as_target(raw)
    target = make_form(dense_target, target_form)
    estimate_data = torch.randn(5, 8, generator=g, dtype=torch.float64)
    pattern_dense = dense_target.clone()
    if pattern == "containing":
        pattern_dense[torch.rand(5, 8, generator=g) < 0.3] = 1.0
    values, sparse_estimate = _sparse_estimate(estimate_data, pattern_dense, estimate_form)
    crit = SparseCriterion(criterion)

    loss = crit(sparse_estimate, target)
    loss.backward()
    dense = estimate_data.clone().requires_grad_()
    expected = crit(dense, target)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    index = pattern_dense.nonzero().t()
    torch.testing.assert_close(values.grad, dense.grad[index[0], index[1]], rtol=0, atol=1e-12)


def test_sparse_estimate_missing_a_target_entry_raises():
    estimate = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).to_sparse()
    target = torch.tensor([[1.0, 3.0], [0.0, 2.0]]).to_sparse()
    with pytest.raises(ValueError, match=r"must specify every entry of the target; "
                                         r"entry \(row 0, col 1\) is missing"):
        SparseCriterion(nn.MSELoss())(estimate, target)


def test_sparse_output_decoder_estimate():
    # The sparse-output decoder returns its outputs at the target's pattern.
    layers = pytest.importorskip("nnsparse.layers")
    if not hasattr(layers, "SparseOutputLinear"):
        pytest.skip("nnsparse.SparseOutputLinear is not in this tree")
    torch.manual_seed(0)
    decoder = layers.SparseOutputLinear(4, 6).double()
    h = torch.randn(3, 4, dtype=torch.float64)
    target = make_form(random_sparse_dense(3, 6, 0.5), "csr")
    crit = SparseCriterion(nn.MSELoss())
    sparse_loss = crit(decoder(h, target), target)
    sparse_loss.backward()
    sparse_grad = decoder.weight.grad.clone()
    decoder.zero_grad()
    dense_loss = crit(decoder(h), target)
    dense_loss.backward()
    torch.testing.assert_close(sparse_loss, dense_loss)
    torch.testing.assert_close(sparse_grad, decoder.weight.grad)


# -- bad input -------------------------------------------------------------------------
def test_rows_mismatch():
    with pytest.raises(ValueError, match=r"target has 2 rows, estimate of shape \(3, 4\) has 3"):
        SparseCriterion(nn.MSELoss())(torch.zeros(3, 4), torch.ones(2, 4).to_sparse())


@pytest.mark.parametrize("form", ["coo", "csr", "list"])
def test_width_mismatch(form):
    target = make_form(torch.ones(3, 5), form)
    with pytest.raises(ValueError, match="target has width 5, the estimate has 4 columns"):
        SparseCriterion(nn.MSELoss())(torch.zeros(3, 4), target)


def test_target_index_beyond_the_estimate():
    target = [torch.tensor([[0.0, 1.0]]), torch.tensor([[4.0, 1.0]])]
    with pytest.raises(ValueError, match=r"target indices must be in \[0, 4\) "
                                         r"\(the columns of the estimate\), got max 4"):
        SparseCriterion(nn.MSELoss())(torch.zeros(2, 4), target)


def test_target_on_another_device():
    estimate = torch.zeros(2, 3, device="meta")
    with pytest.raises(ValueError, match="target is on cpu, estimate on meta"):
        SparseCriterion(nn.MSELoss())(estimate, torch.ones(2, 3).to_sparse())


def test_estimate_of_three_dimensions():
    with pytest.raises(ValueError, match=r"estimate must be 1-D \(n,\) or 2-D \(rows, n\), "
                                         r"got shape \(1, 2, 3\)"):
        SparseCriterion(nn.MSELoss())(torch.zeros(1, 2, 3), torch.ones(2, 3).to_sparse())


@pytest.mark.parametrize("criterion", [nn.CrossEntropyLoss(), nn.NLLLoss(), nn.CosineEmbeddingLoss(),
                                       nn.MultiLabelSoftMarginLoss(), nn.GaussianNLLLoss()])
def test_loss_without_elementwise_form(criterion):
    with pytest.raises(TypeError, match=f"criterion {type(criterion).__name__} has no element-wise form"):
        SparseCriterion(criterion)


def test_not_a_loss():
    with pytest.raises(TypeError, match="criterion must be a loss module such as nn.MSELoss"):
        SparseCriterion(torch.nn.functional.mse_loss)
    with pytest.raises(TypeError, match="with a 'reduction' attribute, got Linear"):
        SparseCriterion(nn.Linear(2, 2))


def test_unknown_loss_uses_its_own_forward():
    class Squared(nn.MSELoss):
        def forward(self, input, target):
            return super().forward(input, target) * 2

    crit = SparseCriterion(Squared(), size_average=False)
    target = torch.tensor([[0.0, 2.0]]).to_sparse()
    assert crit(torch.zeros(1, 2), target).item() == pytest.approx(8.0)


@pytest.mark.parametrize("layout", ["csr", "coo", "coo_vector"])
def test_estimate_built_on_the_target_indices_takes_the_shared_path(layout):
    from nnsparse.criteria._entries import as_estimate

    g = torch.Generator().manual_seed(8)
    dense_target = random_sparse_dense(4, 7, 0.5, generator=g)
    if layout == "coo_vector":
        dense_target = dense_target[1]
    estimate_data = torch.randn(dense_target.shape, generator=g, dtype=torch.float64)
    if layout == "csr":
        target = dense_target.to_sparse_csr()
        values = estimate_data[dense_target != 0].clone().requires_grad_()
        estimate = torch.sparse_csr_tensor(target.crow_indices(), target.col_indices(), values,
                                           target.shape)
    else:
        target = dense_target.to_sparse().coalesce()
        values = estimate_data[dense_target != 0].clone().requires_grad_()
        estimate = torch.sparse_coo_tensor(target.indices(), values, target.shape, is_coalesced=True)
    assert as_estimate(estimate, target).shared is not None
    assert as_estimate(estimate.detach().to_dense().to_sparse(), target).shared is None
    crit = SparseCriterion(nn.L1Loss())
    loss = crit(estimate, target)
    loss.backward()
    dense = estimate_data.clone().requires_grad_()
    expected = crit(dense, target)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(values.grad, dense.grad[dense_target != 0], rtol=0, atol=1e-12)


def test_target_of_another_dtype_is_cast_to_the_estimate_dtype():
    target = torch.tensor([[0.0, 2.0], [3.0, 0.0]], dtype=torch.float64).to_sparse()
    estimate = torch.zeros(2, 2, dtype=torch.float32, requires_grad=True)
    loss = SparseCriterion(nn.MSELoss())(estimate, target)
    loss.backward()
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(6.5)
