"""nnsparse.distributed: 2 gloo processes on localhost against one process.

One spawn runs every case (starting processes costs seconds); each rank
saves its final weights, and the parent compares the ranks with each other
and with a single-process run on the same seed and global batch.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Dict

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import nnsparse
from nnsparse import distributed as nd
from nnsparse.data import SparseRowDataset

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")

WORLD, GLOBAL_BATCH, STEPS, TIMEOUT_S = 2, 8, 3, 60
ROWS, WIDTH, HIDDEN = 16, 30, 8
# name -> (sparse_grad, comm hook for sparse gradients)
CASES = {"dense": (False, False), "sparse": (True, False), "sparse_allgather": (True, True)}


class _AE(nn.Module):
    def __init__(self, sparse_grad: bool) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, sparse_grad=sparse_grad)
        self.decoder = nnsparse.SparseOutputLinear(HIDDEN, WIDTH, sparse_grad=sparse_grad)

    def forward(self, x: Any, pattern: Any = None) -> Any:
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(ROWS, WIDTH, generator=g) < 0.3
    return torch.where(keep, torch.rand(ROWS, WIDTH, generator=g) * 2 - 1, 0.0).to_sparse_csr()


def _train(case: str, device: str = "cpu") -> Dict[str, torch.Tensor]:
    """A few steps; the loss is a sum over the process's rows / its row count, so
    DDP's mean over ranks is the one-process loss over the global batch."""
    sparse_grad, allgather = CASES[case]
    torch.manual_seed(0)
    model = nd.wrap(_AE(sparse_grad).to(device), sparse_allgather=allgather)
    opt = nnsparse.make_optimizer(nd.unwrap(model), lr=0.05)
    ds = SparseRowDataset(_data())
    loader = nd.loader(ds, GLOBAL_BATCH // nd.world_size(), seed=3)
    step = 0
    for epoch in range(STEPS):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            x = batch.input.to(device).to_sparse_coo().coalesce()
            out = model(x, x)
            loss = (out.values() - x.values()).pow(2).sum() / x.shape[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == STEPS:
                return {k: v.detach().cpu() for k, v in nd.unwrap(model).state_dict().items()}
    raise AssertionError("not enough batches")


def _worker(rank: int, port: int, out_dir: str, world: int, device: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    here = nd.init_from_env(device=device, timeout=TIMEOUT_S)
    results: Dict[str, Any] = {}
    try:
        for case in CASES:
            try:
                results[case] = _train(case, here)
            except NotImplementedError as e:  # NCCL, sparse gradients, no hook: refused
                results[case] = str(e)
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        nd.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out: str, world: int, device: str) -> list:
    """Run every case in ``world`` processes; each rank's results (weights or refusal)."""
    ctx = mp.start_processes(_worker, args=(_free_port(), out, world, device), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} processes did not finish in {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:  # only ours; nothing left after a normal join
            if p.is_alive():
                p.kill()
    return [torch.load(os.path.join(out, f"{r}.pt")) for r in range(world)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list:
    return _spawn(str(tmp_path_factory.mktemp("ddp")), WORLD, "cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_ranks_stay_equal(ranks, case):
    first, second = ranks[0][case], ranks[1][case]
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("case", list(CASES))
def test_same_as_one_process(ranks, case):
    single = _train(case)  # no process group: one process, the global batch
    initial = _AE(CASES[case][0]).state_dict()
    for name, value in single.items():
        assert not torch.equal(value, initial[name]), f"{name} did not train"
        torch.testing.assert_close(ranks[0][case][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_single_process_fallbacks():
    model = nn.Linear(2, 2)
    assert not nd.is_distributed()
    assert (nd.rank(), nd.world_size(), nd.is_main()) == (0, 1, True)
    assert nd.wrap(model) is model and nd.unwrap(model) is model
    assert nd.init_from_env(device="cpu") == torch.device("cpu")


@pytest.mark.parametrize("kwargs, env, error, match", [
    (dict(device="tpu"), {}, ValueError, "device must be 'cpu' or 'cuda', got 'tpu'"),
    (dict(device="cpu", backend="mpi"), {}, ValueError, "backend must be 'gloo' or 'nccl'"),
    (dict(device="cpu", backend="nccl"), {}, ValueError, "needs CUDA tensors"),
    (dict(device="cpu"), {"WORLD_SIZE": "two"}, ValueError, "WORLD_SIZE must be an integer"),
])
def test_init_errors(monkeypatch, kwargs, env, error, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(error, match=match):
        nd.init_from_env(**kwargs)


def test_loader_errors():
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        nd.loader(SparseRowDataset(_data()), 0)


@pytest.fixture
def group_of_one():
    """A gloo process group of one process, here, for checks that need a group."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _attach_in_backward(model: nn.Module) -> None:
    """The optimiser-in-backward mode, through its API where this build has it."""
    apply = getattr(nnsparse.optim, "apply_optimizer_in_backward", None)
    if apply is not None:
        apply(model, "adam", lr=0.1)
    else:  # the attribute by which the layers hold it (nnsparse.distributed checks it)
        model.encoder._row_update = object()


def test_wrap_refuses_optimizer_in_backward(group_of_one):
    model = _AE(sparse_grad=False)
    assert isinstance(nd.wrap(model), nd.DistributedDataParallel)  # the group works
    _attach_in_backward(model)
    with pytest.raises(NotImplementedError,
                       match=r"layer 'encoder' has an optimiser in the backward .*never averaged "
                             r"by DistributedDataParallel.*nnsparse.make_optimizer"):
        nd.wrap(model)
    with pytest.raises(NotImplementedError, match="optimiser in the backward"):
        nd.DistributedDataParallel(model)


def _check_nccl(results: list, device: str) -> None:
    for rank in results:
        assert "use sparse_allgather=True, the gloo backend, or sparse_grad=False" in rank["sparse"]
    for case in ("dense", "sparse_allgather"):
        single = _train(case, device)
        for rank in results:
            for name, value in single.items():
                torch.testing.assert_close(rank[case][name], value, rtol=1e-4, atol=1e-5,
                                           msg=f"{case} {name}")


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                    reason="needs CUDA and NCCL")
def test_nccl_one_process(tmp_path):
    """NCCL path on one GPU: the all-gather hook runs on CUDA; sparse without it is refused."""
    _check_nccl(_spawn(str(tmp_path), 1, "cuda"), "cuda:0")


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                    reason="needs 2 CUDA devices and NCCL")
def test_nccl_two_gpus(tmp_path):
    _check_nccl(_spawn(str(tmp_path), 2, "cuda"), "cuda:0")


@pytest.mark.parametrize("bias", [True, False])
def test_sparse_linear_is_a_weighted_sum_embedding_bag(bias):
    """The mapping docs/distributed.md gives for TorchRec's weighted EmbeddingBagCollection:
    table = weight.t(), ids = column indices, lengths = row nnz, weights = values, SUM, + bias."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, bias=bias)
    x = _data()
    lengths = x.crow_indices().diff()
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
    pooled = nn.functional.embedding_bag(x.col_indices(), layer.weight.t(), offsets, mode="sum",
                                         per_sample_weights=x.values())
    expected = pooled + layer.bias if bias else pooled
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("page", ["distributed.md", "ecosystem.md"])
def test_docs_examples_run(page):
    """The ``>>>`` examples of the pages written for the README run as shown."""
    import doctest
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "docs" / page
    result = doctest.testfile(str(path), module_relative=False,
                              optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_ddp_without_torchs_hook_point_refuses_sparse_gradients(group_of_one, monkeypatch):
    monkeypatch.delattr(nn.parallel.DistributedDataParallel, "_build_params_for_reducer")
    with pytest.raises(NotImplementedError, match="no way to declare sparse gradients.*"
                                                  "use sparse_grad=False"):
        nd.wrap(_AE(sparse_grad=True))


@pytest.mark.parametrize("disable, bar", [(None, False), (False, True), (True, False)])
def test_progress_bar_only_on_a_terminal_unless_asked(capsys, disable, bar):
    # capsys's stderr is not a terminal: the default (None) shows no bar there.
    assert list(nd.progress(range(3), disable=disable, desc="steps")) == [0, 1, 2]
    assert ("steps" in capsys.readouterr().err) == bar


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_example_runs_as_one_process(tmp_path, capsys, sparse_grad):
    """examples/ddp_autoencoder.py without torchrun, tiny settings (the 2-process figures are
    in docs/distributed.md)."""
    import importlib.util
    import math
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "ddp_autoencoder.py"
    spec = importlib.util.spec_from_file_location("ddp_autoencoder", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    threads = torch.get_num_threads()
    try:
        result = example.main(["--epochs", "1", "--hidden", "16", "--batch-size", "64",
                               "--save", str(tmp_path / "ae.pt")]
                              + ["--sparse-grad"] * sparse_grad)
    finally:
        torch.set_num_threads(threads)  # the example sets its --threads
    assert 0.5 < result["rmse"] < 2 and math.isfinite(result["mae"])
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == f"test RMSE: {result['rmse']:.4f}"
    assert "epoch 1/1" not in out.err  # no bar when stderr is not a terminal
    state = torch.load(tmp_path / "ae.pt")  # rank 0's save, nn.Linear's layout
    width = state["encoder.weight"].shape[1]
    assert state["encoder.weight"].shape == (16, width)
    example.Autoencoder(width, 16, sparse_grad).load_state_dict(state)
