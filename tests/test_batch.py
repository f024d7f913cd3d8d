"""One training step of the main example validates its batch once and builds each structure once.

The model of ``examples/movielens_autoencoder.py``: a ``SparseLinearBatch``
encoder, a ``SparseOutputLinear`` decoder sampled at the batch's pattern,
``values_map(tanh)``, ``SDAESparseCriterion`` (``prepare_input`` + loss)
and an optimiser step.  The private counters of ``nnsparse._index`` count
validations and structure builds (docs/sparse_batch.md).  The CUDA test runs
the same step under ``torch.cuda.set_sync_debug_mode("error")``.
"""
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse._forms import _counts, _reset_counts
from nnsparse.data import RatingNormalizer, SparseRowDataset, random_split, synthetic_ratings


class Autoencoder(nn.Module):
    """The main example's model: tanh(decoder(tanh(encoder(x)), pattern))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x, pattern=None):
        out = self.decoder(torch.tanh(self.encoder(x)), pattern)
        return nnsparse.values_map(torch.tanh, out)


def _matrix():
    r = synthetic_ratings(seed=0, n_users=60, n_items=40, n_ratings=600)
    train, _, _ = random_split(r, test=0.1, validation=0.05, seed=0)
    return RatingNormalizer(train, "item").matrix(train)


def _setup(device="cpu", sparse_grad=False):
    torch.manual_seed(0)
    x = _matrix()
    model = Autoencoder(x.shape[1], 8).to(device)
    if sparse_grad:
        model.encoder = nnsparse.SparseLinearBatch(x.shape[1], 8, sparse_grad=True).to(device)
    criterion = nnsparse.SDAESparseCriterion(
        nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
        generator=torch.Generator(device=device).manual_seed(0))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    return x, model, criterion, optimiser


def step(model, criterion, optimiser, x):
    out = model(criterion.prepare_input(x), x)
    loss = criterion(out, x)
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return loss


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_a_user_batch_is_validated_once_and_each_structure_built_once(layout):
    x, model, criterion, optimiser = _setup()
    dense = nnsparse.densify(x)[:16]
    batch = dense.to_sparse_csr() if layout == torch.sparse_csr else dense.to_sparse()
    _reset_counts()
    step(model, criterion, optimiser, batch)
    counts = _counts()
    assert counts.get("validate", 0) == 1, counts
    for structure in ("crow", "rows", "column_major", "column_major_all", "sort", "coalesce"):
        assert counts.get(structure, 0) <= 1, (structure, counts)
    # the next step on the same batch checks and builds nothing again
    _reset_counts()
    step(model, criterion, optimiser, batch)
    assert _counts().get("validate", 0) == 0 and _counts().get("crow", 0) == 0, _counts()


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_sparse_gradients_build_nothing_again_on_a_known_batch(layout):
    """Both layers with ``sparse_grad=True`` (the bias gradients sparse too): the
    second step on the same batch builds no index structure at all."""
    x, model, criterion, _ = _setup()
    model.encoder = nnsparse.SparseLinearBatch(x.shape[1], 8, sparse_grad=True)
    model.decoder = nnsparse.SparseOutputLinear(8, x.shape[1], sparse_grad=True)
    optimiser = nnsparse.optim.LazyAdam(model.parameters(), lr=1e-3)
    dense = nnsparse.densify(x)[:16]
    batch = dense.to_sparse_csr() if layout == torch.sparse_csr else dense.to_sparse()
    step(model, criterion, optimiser, batch)
    assert model.decoder.bias.grad is not None and model.decoder.bias.grad.is_sparse
    _reset_counts()
    step(model, criterion, optimiser, batch)
    assert _counts() == {}, _counts()


def test_a_collated_batch_is_never_validated():
    x, model, criterion, optimiser = _setup()
    ds = SparseRowDataset(x)
    batch, _ = ds.collate([ds[i] for i in range(16)])
    _reset_counts()
    step(model, criterion, optimiser, batch)
    counts = _counts()
    assert counts.get("validate", 0) == 0, counts
    assert all(n <= 1 for n in counts.values()), counts


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sync check needs a CUDA device")
@pytest.mark.parametrize("mode", ["auto", "sparse"])
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_a_cuda_step_has_no_host_sync(layout, mode):
    """Dense weight gradients: after a warm-up batch, a step on a trusted batch never syncs.

    ``mode="auto"`` takes the encoder's dense path on CUDA at this density,
    ``"sparse"`` its sparse kernels.
    """
    x, model, criterion, optimiser = _setup("cuda")
    model.encoder.mode = mode
    _step_without_sync(x, model, criterion, optimiser, layout)


def _step_without_sync(x, model, criterion, optimiser, layout=torch.sparse_csr):
    """A warm-up step (kernels, optimiser state), then one under sync-debug "error"."""
    ds = SparseRowDataset(x, layout=layout)
    batches = [ds.collate([ds[i] for i in range(k, k + 16)]).to("cuda") for k in (0, 16)]
    step(model, criterion, optimiser, batches[0].input)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, criterion, optimiser, batches[1].input)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# (LazyAdam is not among them: a sparse gradient is coalesced, a data-dependent size.)
_OPTIMISERS = {
    "in-backward-adam": lambda m: nnsparse.optim.fused_step_optimizer(m, lr=1e-3),
    "in-backward-lazy": lambda m: nnsparse.optim.fused_step_optimizer(m, lr=1e-3,
                                                                      dense_above=None),
    "rowwise-adagrad": lambda m: nnsparse.optim.apply_optimizer_in_backward(
        m, "rowwise_adagrad", lr=3e-3),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sync check needs a CUDA device")
@pytest.mark.parametrize("name", sorted(_OPTIMISERS))
def test_a_cuda_step_with_the_optimiser_in_the_backward_has_no_host_sync(name):
    """The optimiser in the backward on a trusted batch: after a warm-up batch, a step
    never synchronises with the host (``TableUpdate.masked``)."""
    x, model, criterion, _ = _setup("cuda")
    _step_without_sync(x, model, criterion, _OPTIMISERS[name](model))


def test_requires_grad_set_after_a_first_call_is_seen():
    # the attached structure must not hide a later requires_grad_() (uncoalesced COO)
    x = torch.sparse_coo_tensor([[0, 0], [1, 1]], [1., 2.], (1, 2))
    layer = nnsparse.SparseLinearBatch(2, 3)
    layer(x)
    x.requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad.coalesce().values(),
                               layer.weight.sum(0)[[1]].detach())


def test_many_steps_validate_each_batch_once_and_leave_no_structure_behind():
    """Steps over fresh batches (a DataLoader's collated ones, a user's CSR ones): the table
    of checked structures (``nnsparse._forms._STRUCTURES``, an entry per tensor nnsparse
    read) ends as it started, as each entry goes with its tensor; a collated batch is
    never validated, a user's once however many steps read it."""
    import gc

    from torch.utils.data import DataLoader

    from nnsparse import _forms
    x, model, criterion, optimiser = _setup()
    ds = SparseRowDataset(x)
    loader = DataLoader(ds, batch_size=4, shuffle=True, collate_fn=ds.collate,
                        generator=torch.Generator().manual_seed(0))
    dense = nnsparse.densify(x)
    gc.collect()
    before = len(_forms._STRUCTURES)
    for _ in range(2):
        for k, (batch, _target) in enumerate(loader):
            _reset_counts()
            step(model, criterion, optimiser, batch)
            assert _counts().get("validate", 0) == 0, _counts()
            user = dense[4 * k:4 * k + 4].to_sparse_csr()
            _reset_counts()
            step(model, criterion, optimiser, user)
            step(model, criterion, optimiser, user)
            assert _counts().get("validate", 0) == 1, _counts()
    del batch, user
    gc.collect()
    assert len(_forms._STRUCTURES) == before
