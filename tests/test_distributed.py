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


def _spawn(out: str, world: int, device: str, worker: Any = None) -> list:
    """Run ``worker`` (default: every case) in ``world`` processes; each rank's results.

    The port is free when drawn but may be taken before rank 0 listens on it (another
    process on a shared machine): the run is retried on a new port, twice at most."""
    for attempt in range(3):
        try:
            return _spawn_once(out, world, device, worker)
        except mp.ProcessRaisedException as e:
            if attempt == 2 or "EADDRINUSE" not in str(e):
                raise
    raise AssertionError("unreachable")


def _spawn_once(out: str, world: int, device: str, worker: Any) -> list:
    ctx = mp.start_processes(worker or _worker, args=(_free_port(), out, world, device),
                             nprocs=world, join=False, start_method="spawn")
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


def test_single_process_fallbacks(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # (under torchrun, a group would start)
    model = nn.Linear(2, 2)
    assert not nd.is_distributed()
    assert (nd.rank(), nd.world_size(), nd.is_main()) == (0, 1, True)
    assert nd.wrap(model) is model and nd.unwrap(model) is model
    assert nd.init_from_env(device="cpu") == torch.device("cpu")


def test_a_plain_cpu_run_ignores_stray_rank_variables(monkeypatch):
    """Without WORLD_SIZE (a plain ``python script.py``) no group starts: RANK is not read,
    nor LOCAL_RANK on CPU (where it picks nothing)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "-1")
    assert nd.init_from_env(device="cpu") == torch.device("cpu")
    assert not nd.is_distributed()


# (id, the environment init_from_env's doctest runs in): a plain process, and one that
# torchrun launched (alone in its world; the 2-process torchrun run was checked by hand:
# `torchrun --nproc_per_node=2 -m pytest nnsparse/distributed.py`)
DOCTEST_ENVIRONMENTS = [
    ("plain-python", {}),
    ("under-torchrun", {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1"}),
]


@pytest.mark.parametrize("env", [e for _, e in DOCTEST_ENVIRONMENTS],
                         ids=[i for i, _ in DOCTEST_ENVIRONMENTS])
def test_the_init_from_env_example_holds_with_and_without_torchrun(monkeypatch, env):
    """The doctest once said ``"WORLD_SIZE" in os.environ`` is False, and failed under torchrun."""
    import doctest
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if env:
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    [test] = doctest.DocTestFinder().find(nd.init_from_env, "init_from_env",
                                          globs={"torch": torch, "nnsparse": nnsparse})
    out: list = []
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    result = runner.run(test, out=out.append)
    assert (result.failed, result.attempted) == (0, 4), "".join(out)
    assert not nd.is_distributed()  # the example leaves the group it joined


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


@pytest.mark.parametrize("path, match", [
    (lambda tmp: tmp, r"path must be a file to write, got .*, which is a directory"),
    (lambda tmp: str(tmp / "missing" / "x.pt"),
     r"path must be a file in an existing directory, got .*x.pt: no directory .*missing"),
    (lambda tmp: tmp / "missing" / "deeper" / "x.pt", r"no directory .*deeper to write it in"),
], ids=["directory", "missing-parent", "missing-parent-pathlike"])
def test_save_path_errors(tmp_path, path, match):
    with pytest.raises(ValueError, match=match):
        nd.save({"a": 1}, path(tmp_path))
    assert not (tmp_path / "missing").exists()


def test_save_writes_a_file(tmp_path):
    nd.save({"a": torch.ones(2)}, tmp_path / "x.pt")
    assert torch.equal(torch.load(tmp_path / "x.pt")["a"], torch.ones(2))


@pytest.mark.parametrize("batch_size, error", [
    (0, ValueError), (-3, ValueError), ("2", TypeError), (2.0, TypeError), (True, TypeError),
])
def test_loader_errors(batch_size, error):
    with pytest.raises(error, match=f"^batch_size must be a positive int, got {batch_size!r}$"):
        nd.loader(SparseRowDataset(_data()), batch_size)


def test_loader_takes_a_numpy_int_batch_size():
    np = pytest.importorskip("numpy")
    batches = list(nd.loader(SparseRowDataset(_data()), np.int64(2), shuffle=False))
    assert batches and all(b.shape[0] <= 2 for b, *_ in batches)


@pytest.mark.parametrize("seed", [0, -2 ** 63, 2 ** 63, 2 ** 64 - 2, 2 ** 64, -2 ** 70,
                                  __import__("numpy").int64(5)])
def test_loader_takes_any_int_seed(seed):
    """Any int, as the models' seeds: torch.Generator's range as it is (the sampler seeds
    with seed + epoch), others folded into it (data.split._torch_seed)."""
    loader = nd.loader(SparseRowDataset(_data()), 4, seed=seed)
    loader.sampler.set_epoch(1)  # type: ignore[attr-defined]
    rows = [b.row_index.tolist() for b in loader]
    assert len(rows) == -(-ROWS // 4)
    again = nd.loader(SparseRowDataset(_data()), 4, seed=seed)
    again.sampler.set_epoch(1)  # type: ignore[attr-defined]
    assert [b.row_index.tolist() for b in again] == rows  # the same seed, the same order


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


_DDP_WRAPPERS = {
    "torch": lambda m: nn.parallel.DistributedDataParallel(m),
    "nnsparse": lambda m: nd.DistributedDataParallel(m),
    "wrap": lambda m: nd.wrap(m),
}
_IN_DDP = (r"SparseLinearBatch 'encoder': its optimiser in the backward \(nnsparse.optim."
           r"apply_optimizer_in_backward\) runs inside DistributedDataParallel \(attached to "
           r"ddp.module, or before wrapping\).*never all-reduces.*call remove\(\) on the "
           r"in-backward optimiser and train with materialised gradients")


def _snapshot(model: nn.Module, opt: Any) -> Dict[str, torch.Tensor]:
    tensors = {k: v.clone() for k, v in model.state_dict().items()}
    for name, table in opt.tables.items():
        tensors.update({f"{name}.{k}": v.clone() for k, v in table.items()})
    return tensors


@pytest.mark.parametrize("order, wrapper", [("wrap-then-attach-to-module", w) for w in _DDP_WRAPPERS]
                         + [("attach-then-wrap", "torch")])  # (nnsparse's refuse: test above)
def test_in_backward_optimiser_inside_ddp_is_refused_at_the_forward(group_of_one, wrapper, order):
    """Before: apply_optimizer_in_backward(ddp.module) (or attaching before torch's DDP,
    which nnsparse's wrapper refuses) trained, each rank stepping the in-backward rows from
    its own gradient: the ranks drift apart.  Now the training forward through DDP refuses,
    before anything moves; a no_grad forward (evaluation) and the module alone still run."""
    torch.manual_seed(0)
    model = _AE(sparse_grad=False)
    x = _data().to_sparse_coo()
    if order == "wrap-then-attach-to-module":
        ddp = _DDP_WRAPPERS[wrapper](model)
        opt = nnsparse.optim.apply_optimizer_in_backward(ddp.module, "adam", lr=0.1)
    else:
        opt = nnsparse.optim.apply_optimizer_in_backward(model, "adam", lr=0.1)
        ddp = _DDP_WRAPPERS[wrapper](model)
    assert ddp is not model
    before = _snapshot(model, opt)
    with pytest.raises(NotImplementedError, match=_IN_DDP):
        ddp(x, x).values().sum().backward()
    after = _snapshot(model, opt)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(ddp(x, x).to_dense(), model(x, x).to_dense())


def test_in_backward_weights_ddp_ignores_may_train_locally(group_of_one):
    """Parameters DDP is told to ignore are the user's to keep in step (torch's
    _ddp_params_and_buffers_to_ignore): their in-backward optimiser is not refused."""
    model = _AE(sparse_grad=False)
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, ["encoder.weight", "decoder.weight"])  # (DDP needs one parameter left)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = nnsparse.optim.apply_optimizer_in_backward(ddp.module, "sgd", lr=0.1)
    x = _data().to_sparse_coo()
    weight = model.encoder.weight.detach().clone()
    opt.zero_grad()
    ddp(x, x).values().sum().backward()
    opt.step()
    assert not torch.equal(model.encoder.weight, weight)


class _Holder(nn.Module):
    """A dense module whose forward runs ``model`` (held, or not, as a submodule) before
    ``inner`` (a DDP of its own, or a plain module)."""

    def __init__(self, model: nn.Module, held: bool, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.head = inner, nn.Linear(WIDTH, 1)
        if held:
            self.model = model
        self.__dict__["_run"] = model  # (not registered: a submodule only when held)

    def forward(self, x: Any) -> torch.Tensor:
        return self.head(self.inner(self._run(x, x).to_dense())).sum()


def _nested(held: bool, inner_ddp: bool, ignore_inner: bool = False) -> Any:
    model = _AE(sparse_grad=False)
    inner: nn.Module = nn.Linear(WIDTH, WIDTH)
    if inner_ddp:
        inner = nn.parallel.DistributedDataParallel(inner)
    holder = _Holder(model, held, inner)
    if ignore_inner:  # the outer DDP leaves the inner DDP's parameters to it
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            holder, [n for n, _ in holder.named_parameters() if n.startswith("inner.")])
    return model, nn.parallel.DistributedDataParallel(holder)


# (model held by the outer DDP's module, inner module a DDP) -> refused?
_NESTED = {
    # a model outside the wrapped module, run in its forward: DDP averages none of its
    # gradients, with any optimiser: the user's to keep in step, as an ignored weight
    # (refused in between: review rvm)
    "model-outside-the-ddp-module-trains": (False, False, False),
    "model-outside-after-an-inner-ddp-trains": (False, True, False),
    # torch 2.13 puts the outer DDP's mark back after an inner DDP's forward
    "model-of-the-outer-ddp-run-after-an-inner-ddp": (True, True, True),
    "model-of-the-ddp-module": (True, False, True),
}


@pytest.mark.parametrize("case", list(_NESTED))
def test_in_backward_optimiser_refused_only_for_weights_ddp_averages(group_of_one, case):
    held, inner_ddp, refused = _NESTED[case]
    torch.manual_seed(0)
    model, ddp = _nested(held, inner_ddp, ignore_inner=held and inner_ddp)
    opt = nnsparse.optim.apply_optimizer_in_backward(model, "adam", lr=0.1)
    x = _data().to_sparse_coo()
    before = _snapshot(model, opt)
    if refused:
        with pytest.raises(NotImplementedError, match=_IN_DDP):
            ddp(x).backward()
        after = _snapshot(model, opt)
        assert [k for k in before if not torch.equal(before[k], after[k])] == []
        return
    opt.zero_grad()
    ddp(x).backward()
    opt.step()
    after = _snapshot(model, opt)
    assert not torch.equal(before["encoder.weight"], after["encoder.weight"])
    assert not torch.equal(before["decoder.weight"], after["decoder.weight"])


def test_in_backward_weight_whose_all_reduce_ddp_delays_is_refused(group_of_one):
    """delay_all_reduce_named_params: left out of DDP's bucketed parameters, still averaged."""
    model = _AE(sparse_grad=False)
    ddp = nn.parallel.DistributedDataParallel(
        model, delay_all_reduce_named_params=[("encoder.weight", model.encoder.weight)],
        param_to_hook_all_reduce=model.decoder.bias)
    nnsparse.optim.apply_optimizer_in_backward(ddp.module, "adam", lr=0.1)
    x = _data().to_sparse_coo()
    with pytest.raises(NotImplementedError, match=_IN_DDP):
        ddp(x, x).values().sum().backward()


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


# -- the models' fit and the main example under torchrun -------------------------------
FIT = dict(hidden=8, epochs=4, batch_size=16, validation_ratio=0.1, patience=2, seed=0)
EXAMPLE_ARGS = ["--epochs", "2", "--hidden", "8", "--threads", "1", "--no-progress"]


def _fit_tiny() -> Dict[str, Any]:
    """KernelNet on 50 item rows (even: no row repeated by the sampler), global batch 16,
    validation, early stopping and refit; its weights, test predictions and RMSE."""
    from nnsparse.data import split_ratings, synthetic_ratings
    from nnsparse.models import KernelNet
    train, test = split_ratings(synthetic_ratings(0, 60, 50, 1200), 0.1, seed=0)
    model = KernelNet(**FIT).fit(train, verbose=False, progress=False)
    return dict(state={k: v.detach().clone() for k, v in model.state_dict().items()},
                pred=model.predict(test), rmse=model.evaluate(test)["rmse"],
                best_epoch=model.best_epoch, history=model.history)


def _load_example() -> Any:
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "movielens_autoencoder.py"
    spec = importlib.util.spec_from_file_location("movielens_autoencoder", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _models_worker(rank: int, port: int, out_dir: str, world: int, device: str) -> None:
    """``fit`` in a process group, then the main example as torchrun starts it (its stdout kept)."""
    import contextlib
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    nd.init_from_env(device=device, timeout=TIMEOUT_S)
    try:
        results = _fit_tiny()
        # The example finds the group joined (init_from_env starts none then: a second
        # group on the same port could meet the first one's store) and leaves it at the end.
        with open(os.path.join(out_dir, f"stdout{rank}.txt"), "w") as f, \
                contextlib.redirect_stdout(f):
            example = _load_example().main(EXAMPLE_ARGS
                                           + ["--save", os.path.join(out_dir, "model.pt")])
        results["example_rmse"] = example["test_rmse"]
        results["example_initialised_after"] = dist.is_initialized()
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        nd.cleanup()


@pytest.fixture(scope="module")
def fit_ranks(tmp_path_factory) -> tuple:
    out = tmp_path_factory.mktemp("ddp_fit")
    return out, _spawn(str(out), WORLD, "cpu", _models_worker)


def test_fit_ranks_end_equal(fit_ranks):
    out, (first, second) = fit_ranks
    assert first["best_epoch"] == second["best_epoch"] >= 1
    curves = [[e["valid_rmse"] for e in rank["history"]] for rank in (first, second)]
    assert curves[0] == curves[1]
    for name in first["state"]:
        torch.testing.assert_close(first["state"][name], second["state"][name], rtol=0, atol=1e-6,
                                   msg=name)
    torch.testing.assert_close(first["pred"], second["pred"], rtol=0, atol=1e-6)
    assert first["rmse"] == second["rmse"]


def test_fit_same_as_one_process_with_the_same_batches(fit_ranks, group_of_one):
    """One process in a group of one shuffles as the 2 ranks do together (DistributedSampler,
    seed + epoch), so with the global batch it takes the same steps: equal up to rounding."""
    _, (first, _) = fit_ranks
    single = _fit_tiny()
    assert single["best_epoch"] == first["best_epoch"]
    for ours, theirs in zip(first["history"], single["history"]):  # the loss of the global batch
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
        assert ours["valid_rmse"] == pytest.approx(theirs["valid_rmse"], abs=1e-6)
    for name, value in single["state"].items():
        torch.testing.assert_close(first["state"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert abs(single["rmse"] - first["rmse"]) < 1e-4


def test_fit_near_the_plain_one_process_trainer(fit_ranks):
    """The one-process Trainer draws other batches (its own shuffle): close, not equal
    (measured: 1.05695 against 1.05652)."""
    _, (first, _) = fit_ranks
    assert abs(_fit_tiny()["rmse"] - first["rmse"]) < 0.005


def test_main_example_under_two_processes(fit_ranks):
    out, (first, second) = fit_ranks
    assert first["example_rmse"] == second["example_rmse"]
    assert not first["example_initialised_after"]  # the example left its group
    lines = (out / "stdout0.txt").read_text().splitlines()
    assert lines[-1] == f"test RMSE: {first['example_rmse']:.4f}"
    assert sum(line.startswith("epoch 1:") for line in lines) == 2  # fit and refit, once each
    assert (out / "stdout1.txt").read_text() == ""  # rank 1 prints nothing
    from nnsparse.models import RatingModel
    assert RatingModel.load(out / "model.pt").hparams["hidden"] == 8  # rank 0 saved it


def test_distributed_trainer_errors(group_of_one):
    from nnsparse.models import DistributedTrainer
    model = nn.Linear(2, 2)
    dist.destroy_process_group()
    try:
        with pytest.raises(RuntimeError, match="DistributedTrainer needs a process group"):
            DistributedTrainer(model, epochs=1, batch_size=4, lr=0.1)
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert DistributedTrainer(model, epochs=1, batch_size=3, lr=0.1).world == 1


def test_distributed_trainer_needs_a_divisible_global_batch(group_of_one, monkeypatch):
    from nnsparse.models import DistributedTrainer
    monkeypatch.setattr(nd, "world_size", lambda: 2)
    with pytest.raises(ValueError, match="batch_size .the global batch. must be a multiple of "
                                         "the 2 processes, got 3"):
        DistributedTrainer(nn.Linear(2, 2), epochs=1, batch_size=3, lr=0.1)


def test_main_example_refuses_a_global_batch_the_processes_cannot_split(monkeypatch, capsys):
    monkeypatch.setattr(nd, "world_size", lambda: 2)  # as under torchrun --nproc_per_node=2
    with pytest.raises(SystemExit):
        _load_example().main(["--batch-size", "3", "--epochs", "1"])
    assert ("--batch-size 3 (the global batch) must be a multiple of the 2 processes"
            in capsys.readouterr().err)


def test_main_example_refuses_glocalk_under_torchrun_before_reading(monkeypatch, capsys):
    """GLocalK's fit refuses a process group; the example says so as a usage error, before
    the data are read, not with a traceback after."""
    monkeypatch.setattr(nd, "world_size", lambda: 2)  # as under torchrun --nproc_per_node=2
    with pytest.raises(SystemExit) as stop:
        _load_example().main(["--model", "glocalk", "--epochs", "1"])
    assert stop.value.code == 2
    assert "--model glocalk does not train under torchrun yet" in capsys.readouterr().err


def _validate_worker(rank: int, port: int, out_dir: str, world: int, device: str) -> None:
    """``DistributedTrainer.validation_rmse`` with a ``validate`` that returns a score
    (-0.5, refused on rank 0, the only rank that calls it) or raises; each rank's error."""
    from nnsparse.models import DistributedTrainer
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    nd.init_from_env(device=device, timeout=TIMEOUT_S)
    results: Dict[str, Any] = {}
    try:
        trainer = DistributedTrainer(nn.Linear(2, 2), epochs=1, batch_size=2, lr=0.1)
        for case, validate in (("negative", lambda: -0.5), ("raises", lambda: {}["x"]),
                               ("fine", lambda: 0.25)):
            try:
                results[case] = trainer.validation_rmse(validate)
            except Exception as e:  # noqa: BLE001 -- each rank's error is the result
                results[case] = (type(e).__name__, str(e))
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        nd.cleanup()


def test_a_validate_refused_on_rank_0_raises_on_every_rank(tmp_path):
    """Rank 0's validate() result refused (a negative score) or its error: rank 0 raised and
    the other ranks waited in the broadcast for a value that never came (a hang, or gloo's
    error once rank 0 left).  Now every rank raises; a rank other than 0 says why."""
    first, second = _spawn(str(tmp_path), WORLD, "cpu", _validate_worker)
    assert first["negative"][0] == "ValueError" and "validate must return the validation " \
        "RMSE" in first["negative"][1]
    assert first["raises"][0] == "KeyError"
    for case, error in (("negative", "ValueError"), ("raises", "KeyError")):
        assert second[case] == ("RuntimeError", f"validate() raised {error} on rank 0, which "
                                f"computes the validation RMSE: see rank 0's error"), case
    assert first["fine"] == second["fine"] == 0.25  # the group is still usable after them


@pytest.mark.parametrize("cls, name", [(nnsparse.SparseLinearBatch, "weight_t"),
                                       (nnsparse.SparseOutputLinear, "weight")])
def test_ddp_trains_a_sparse_grad_layer_with_a_parametrized_weight(group_of_one, cls, name):
    """A parametrized weight's calls give dense gradients (the bias's too): DDP's reducer is
    not told they are sparse, and a training step on a sparse batch runs."""
    torch.manual_seed(0)
    layer = nn.utils.parametrizations.weight_norm(cls(6, 4, sparse_grad=True), name=name)
    ddp = nd.DistributedDataParallel(layer)
    x = (torch.randn(5, 6) * (torch.rand(5, 6) < 0.5)).to_sparse()
    args = ((x,) if cls is nnsparse.SparseLinearBatch
            else (torch.randn(5, 6), (torch.rand(5, 4) < 0.5).float().to_sparse()))
    out = ddp(*args)
    (out if out.layout == torch.strided else out.values()).sum().backward()
    assert all(p.grad is not None and p.grad.layout == torch.strided for p in layer.parameters())
