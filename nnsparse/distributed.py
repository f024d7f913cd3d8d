"""Data-parallel training of nnsparse models with ``torchrun`` and ``DistributedDataParallel``.

A training script becomes data-parallel with a few lines (see
``examples/ddp_autoencoder.py`` and ``docs/distributed.md``)::

    device = nnsparse.distributed.init_from_env()           # gloo on CPU, NCCL on CUDA
    loader = nnsparse.distributed.loader(dataset, batch_size=16, seed=0)  # per process
    model = nnsparse.distributed.wrap(model.to(device))     # DDP, sparse gradients known
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        ...
    if nnsparse.distributed.is_main():
        torch.save(nnsparse.distributed.unwrap(model).state_dict(), path)

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) every helper
falls back to one process: :func:`init_from_env` starts no process group,
:func:`wrap` returns the model, :func:`is_main` is ``True``.

**Sparse gradients.**  ``DistributedDataParallel`` decides which parameters
get a sparse gradient from the module type only (``nn.Embedding`` and
``nn.EmbeddingBag`` with ``sparse=True``); it treats every other gradient as
dense and copies it into a flat bucket, which fails on a sparse COO gradient
with ``NotImplementedError: Cannot access storage of SparseTensorImpl``.
:class:`DistributedDataParallel` here is torch's with one difference: it
also declares the parameters of ``SparseLinearBatch(sparse_grad=True)`` and
``SparseOutputLinear(sparse_grad=True)`` as sparse.  gloo all-reduces sparse
tensors; NCCL does not, so on NCCL :func:`wrap` registers
:func:`sparse_allgather_hook`, which all-gathers the indices and values of
each sparse gradient (dense buckets are all-reduced as usual).
"""
import datetime
import inspect
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys  # nn.Module.load_state_dict's type
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm as _tqdm

from ._forms import as_count, as_flag, check_file_object
from ._load import check_state_dict
from ._optim_split import sparse_grad_parameters
from .data.readers import _path
from .data.split import _torch_seed

__all__ = ["init_from_env", "is_distributed", "rank", "world_size", "is_main", "main_print",
           "progress", "save", "loader", "wrap", "unwrap", "DistributedDataParallel",
           "sparse_allgather_hook", "cleanup"]

_TORCH_DDP = nn.parallel.DistributedDataParallel
_T = TypeVar("_T")


def is_distributed() -> bool:
    """Whether a default process group is initialised.

    Returns:
        bool: ``True`` under ``torchrun`` after :func:`init_from_env`, else ``False``.

    Example::

        >>> nnsparse.distributed.is_distributed()   # a plain python process
        False
        >>> nnsparse.distributed.rank(), nnsparse.distributed.world_size()
        (0, 1)
        >>> nnsparse.distributed.is_main()
        True
    """
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's global rank.

    Returns:
        int: ``torch.distributed.get_rank()``; 0 without a process group.
    """
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """The number of processes.

    Returns:
        int: ``torch.distributed.get_world_size()``; 1 without a process group.
    """
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Whether this is rank 0, the process that prints, shows bars and saves.

    Returns:
        bool: ``True`` on rank 0 and without a process group.
    """
    return rank() == 0


def _env_int(name: str, default: int, low: int = 0, high: Optional[int] = None) -> int:
    """The integer environment variable ``name`` in ``[low, high)`` (``default`` when unset)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {text!r}") from None
    if value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"environment variable {name} must be an integer {bound}, got {text!r}")
    return value


def init_from_env(backend: Optional[str] = None, device: Optional[str] = None,
                  timeout: float = 300.0) -> torch.device:
    r"""Join the process group that ``torchrun`` describes, and pick this process's device.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``MASTER_ADDR`` /
    ``MASTER_PORT``, through torch's ``env://`` rendezvous).  Without
    ``WORLD_SIZE`` (a plain ``python script.py``) no group is started and the
    script runs as one process.

    Args:
        backend (str, optional): ``"gloo"`` or ``"nccl"``; default gloo for a
            CPU device, NCCL for CUDA.
        device (str, optional): ``"cpu"`` or ``"cuda"``; default CUDA when
            available.  On CUDA each process takes ``cuda:LOCAL_RANK``.
        timeout (float): seconds a collective may wait for the other
            processes before failing (instead of hanging).

    Returns:
        torch.device: the device this process trains on.

    Raises:
        ValueError: an unknown ``device`` or ``backend``, a non-integer
            environment variable of a launched run (or a negative ``LOCAL_RANK``, a
            ``WORLD_SIZE`` below 1, a ``RANK`` outside ``[0, WORLD_SIZE)``, a
            ``MASTER_PORT`` outside ``[0, 65536)`` where a group is to be joined; without
            ``WORLD_SIZE`` only ``LOCAL_RANK`` on CUDA is read), or NCCL on a CPU device.
        RuntimeError: ``device="cuda"`` without CUDA.
        TypeError: a ``timeout`` that is not a number, a ``backend`` or ``device``
            that is not None or a str.
        ValueError: a ``timeout`` that is not positive and finite.

    Example::

        >>> import os
        >>> nnsparse.distributed.init_from_env(device="cpu")
        device(type='cpu')
        >>> # a plain python process (no WORLD_SIZE) runs alone; under torchrun it joined the group
        >>> nnsparse.distributed.is_distributed() == ("WORLD_SIZE" in os.environ)
        True
        >>> nnsparse.distributed.cleanup()   # leaves the group, if any, at the end of a script
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout}")
    for name, value in (("backend", backend), ("device", device)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be None or a str, got {type(value).__name__}")
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for, but torch sees no CUDA device; "
                           "use device='cpu' (gloo)")
    backend = backend or ("nccl" if kind == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and kind == "cpu":
        raise ValueError("backend='nccl' needs CUDA tensors, got device='cpu'; use gloo")
    launched = "WORLD_SIZE" in os.environ  # by torchrun (or by hand), even with 1 process
    # The variables a run uses, checked before anything changes (a rank beyond the
    # world waits out the whole timeout in the rendezvous for peers that never come):
    # the ranks when launched, LOCAL_RANK also where it picks the GPU.
    if launched:
        _env_int("RANK", 0, high=_env_int("WORLD_SIZE", 1, low=1))
    if launched and not is_distributed():  # where torch's env:// rendezvous reads it: its
        # int() said "invalid literal for int() with base 10", naming no variable
        _env_int("MASTER_PORT", 0, high=65536)
    local = _env_int("LOCAL_RANK", 0) if launched or kind == "cuda" else 0
    out = torch.device(kind, local) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(out)
    if launched and not is_distributed():
        device_id: Dict[str, Any] = {"device_id": out} if kind == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **device_id)
    return out


def cleanup() -> None:
    """Leave the process group (if any); call once at the end of a script.

    The ranks first meet at a barrier, so that none tears its connections down
    while another still uses them (without it, gloo once aborted a process at
    exit here, "terminate called without an active exception", in a 2-process
    test run).  A
    barrier that fails because another rank is gone is passed over.

    Example::

        >>> nnsparse.distributed.cleanup()   # without a process group: nothing to do
    """
    if is_distributed():
        try:
            dist.barrier()
        except RuntimeError:
            pass  # a peer already left (its error is the one to report)
        dist.destroy_process_group()


def main_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only.

    Args:
        *args, **kwargs: ``print``'s.

    Example::

        >>> nnsparse.distributed.main_print("epoch", 1)
        epoch 1
    """
    if is_main():
        print(*args, **kwargs)


# tqdm's keyword arguments (its own **kwargs takes gui-only ones and refuses the rest);
# iterable and disable are progress's own
_TQDM_ARGUMENTS = frozenset(
    name for name, p in inspect.signature(_tqdm.__init__).parameters.items()
    if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD) - {"self", "iterable",
                                                                          "disable"}


def progress(iterable: Iterable[_T], disable: Optional[bool] = None,
             **kwargs: Any) -> Iterable[_T]:
    """A tqdm bar over ``iterable`` on rank 0; the bare iterable on other ranks.

    Args:
        iterable: what to iterate over.
        disable (bool, optional): ``True``: no bar; ``False``: a bar on rank 0;
            ``None`` (default): a bar on rank 0 when its output (stderr, or
            ``file=``) is a terminal, none in a log file or pipe.
        **kwargs: passed to ``tqdm`` (``desc``, ``leave``, ``file``, ...).

    Returns:
        Iterable: a ``tqdm`` over ``iterable`` on rank 0 with a bar, else ``iterable``
        itself.

    Raises:
        TypeError: ``disable`` not None or a bool, ``iterable`` not iterable, a
            keyword tqdm does not take (checked on every rank, bar or not).

    Example::

        >>> batches = [1, 2, 3]
        >>> nnsparse.distributed.progress(batches, disable=True, desc="epoch 1") is batches
        True
    """
    if disable is not None:  # numpy bools pass, as loader's flags (they said "got bool")
        disable = as_flag(disable, "disable", "None or a bool")
    if not hasattr(iterable, "__iter__"):
        raise TypeError(f"iterable must be iterable, got {type(iterable).__name__}")
    unknown = sorted(set(kwargs) - _TQDM_ARGUMENTS)
    if unknown:  # checked on every rank and without a bar: a typo failed on rank 0 only
        raise TypeError(f"kwargs must be tqdm's arguments, got unknown {unknown}")
    if disable or not is_main():
        return iterable
    return cast(Iterable[_T],  # tqdm's None: off unless a terminal
                _tqdm(iterable, disable=disable, **kwargs))


def save(obj: Any, path: Any) -> None:
    """``torch.save`` on rank 0, then every rank waits (so no reader sees half a file).

    Args:
        obj: what ``torch.save`` takes (a ``state_dict``, a module...).
        path (str, os.PathLike or binary file object): where to write it (``~``
            expanded, as the rating readers expand it).

    Raises:
        TypeError: ``path`` is not a path or a binary file object.
        ValueError: ``path`` is empty or a directory, or its directory does not exist;
            a file object that is closed or not open for writing.

    Example::

        >>> import io
        >>> buffer = io.BytesIO()
        >>> nnsparse.distributed.save({"step": torch.tensor(3)}, buffer)
        >>> _ = buffer.seek(0)
        >>> torch.load(buffer, weights_only=True)
        {'step': tensor(3)}
    """
    if not isinstance(path, (str, os.PathLike)) and not hasattr(path, "write"):
        raise TypeError(f"path must be a str or os.PathLike (or a file object), got "
                        f"{type(path).__name__}")
    if isinstance(path, (str, os.PathLike)):
        if not os.fspath(path):
            raise ValueError("path must name a file to write, got ''")
        path = _path(path)
        if os.path.isdir(path):
            raise ValueError(f"path must be a file to write, got {path}, which is a directory")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ValueError(f"path must be a file in an existing directory, got {path}: no "
                             f"directory {parent} to write it in")
    else:
        check_file_object(path, "path", "write")
    if is_main():
        torch.save(obj, path)
    if is_distributed():
        dist.barrier()


def loader(dataset: Dataset[Any], batch_size: int, *, shuffle: bool = True, seed: int = 0,
           drop_last: bool = False, **kwargs: Any) -> DataLoader[Any]:
    r"""A ``DataLoader`` that gives this process its share of ``dataset``.

    Each epoch the rows are shuffled with ``seed + epoch`` (call
    ``loader.sampler.set_epoch(epoch)``), the same permutation on every
    rank, and rank ``r`` reads rows ``r, r + world, ...`` of it.  With
    ``batch_size`` per process, step ``k`` of all ranks together reads the
    rows that one process with ``batch_size * world_size()`` reads at its
    step ``k``, so runs with the same seed and global batch see the same
    batches.  (When ``len(dataset)`` is not a multiple of the world size,
    torch's ``DistributedSampler`` repeats a few rows to even out the shares.)

    Args:
        dataset: any map-style dataset; one with a ``collate`` method
            (:class:`nnsparse.data.SparseRowDataset`) gets it as ``collate_fn``.
        batch_size (int): rows per process and step.
        shuffle, seed, drop_last: as ``DistributedSampler``'s.
        **kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``, ...).

    Returns:
        DataLoader: with a ``DistributedSampler`` as ``loader.sampler``.

    Raises:
        ValueError: ``batch_size`` is not positive, or is beyond int64.
        TypeError: ``batch_size`` or ``seed`` is not an int, ``shuffle`` or ``drop_last``
            is not a bool, ``kwargs`` sets ``sampler`` or ``batch_sampler`` (the loader's
            own), or ``dataset`` is not map-style (no ``__len__`` and ``__getitem__``).

    Example::

        >>> rows = torch.utils.data.TensorDataset(torch.arange(6.))
        >>> batches = nnsparse.distributed.loader(rows, batch_size=4, shuffle=False)
        >>> [batch[0].tolist() for batch in batches]   # one process reads every row
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    """
    # numpy ints pass; none beyond int64 (the sampler's islice takes none)
    batch_size = as_count("batch_size", batch_size, 1, must="positive")
    shuffle, drop_last = as_flag(shuffle, "shuffle"), as_flag(drop_last, "drop_last")
    seed = _torch_seed(seed)  # any int, as the models' seeds (torch.Generator's range as is)
    taken = [k for k in ("sampler", "batch_sampler")
             if k in kwargs and (k == "sampler" or kwargs[k] is not None)]
    if taken:
        raise TypeError(f"kwargs must not set {' or '.join(taken)}: loader makes its own "
                        "DistributedSampler; use a DataLoader directly for another sampler")
    if isinstance(dataset, (str, bytes)) or not (hasattr(dataset, "__getitem__")
                                                 and hasattr(dataset, "__len__")):
        raise TypeError(f"dataset must be a map-style dataset (with __len__ and "
                        f"__getitem__), got {type(dataset).__name__}")
    if isinstance(dataset, Tensor) and dataset.dim() == 0:  # torch: "len() of a 0-d tensor"
        raise TypeError("dataset must be a map-style dataset (with __len__ and __getitem__), "
                        "got a 0-d tensor")
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world_size(), rank=rank(), shuffle=shuffle, seed=seed,
        drop_last=drop_last)
    if "collate_fn" not in kwargs and hasattr(dataset, "collate"):
        kwargs["collate_fn"] = dataset.collate
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


# The attribute by which nnsparse's sparse layers hold an optimiser applied in
# their backward (set by nnsparse.optim.apply_optimizer_in_backward; None when absent).
_IN_BACKWARD_ATTR = "_row_update"


def _refuse_in_backward(model: nn.Module) -> None:
    """Raise when a layer of ``model`` updates its weight inside the backward."""
    for name, module in model.named_modules():
        if getattr(module, _IN_BACKWARD_ATTR, None) is not None:
            raise NotImplementedError(
                f"module: layer {name or type(module).__name__!r} has an optimiser in the "
                "backward (nnsparse.optim.apply_optimizer_in_backward), whose row updates use "
                "this process's gradient only and are never averaged by "
                "DistributedDataParallel; call remove() on that optimiser and train with "
                "materialised gradients (nnsparse.make_optimizer) under DDP")


class DistributedDataParallel(_TORCH_DDP):
    r"""``torch.nn.parallel.DistributedDataParallel`` that knows nnsparse's sparse gradients.

    Takes torch's arguments.  The parameters listed by
    :func:`nnsparse.sparse_grad_parameters` (nnsparse layers with
    ``sparse_grad=True``, sparse ``nn.Embedding``/``EmbeddingBag``) are
    declared to DDP's reducer as sparse: each gets its own bucket and is
    reduced as a sparse tensor (gloo's sparse all-reduce, or the registered
    comm hook).  Everything else is torch's DDP.

    A ``SparseOutputLinear(sparse_grad=True)`` without a pattern, and a
    ``SparseLinearBatch(sparse_grad=True)`` given a dense input, give sparse
    gradients over every row; under ``torch.compile``, ``torch.jit.trace`` or in
    ``torch.func`` transforms their gradients are dense, and so are a layer's
    on any input with a weight read as a view of a tensor that requires grad,
    which DDP refuses for a parameter declared sparse.  A layer with a
    parametrized weight gets dense gradients and is not declared sparse: it
    trains.

    Raises:
        TypeError: ``module`` not an ``nn.Module``; an argument torch's DDP does
            not take (checked before the process group).
        NotImplementedError: a layer of ``module`` has an optimiser in the
            backward (:func:`nnsparse.optim.apply_optimizer_in_backward`):
            its rows are updated from this process's gradient during
            ``backward``, before DDP's reducer could average anything, so the
            ranks would drift apart.  Train such a model under DDP with
            materialised gradients (:func:`nnsparse.make_optimizer`).  Also when
            ``module`` has sparse gradients and torch's DDP lacks the method
            through which they are declared (``_build_params_for_reducer``;
            present in the torch versions tested, 2.11 and 2.13).
    """

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        signature = inspect.signature(_TORCH_DDP.__init__)
        try:
            group = signature.bind(self, module, *args, **kwargs)
        except TypeError as error:  # inspect's "got an unexpected keyword argument 'x'"
            known = [name for name in signature.parameters if name not in ("self", "module")]
            raise TypeError(f"DistributedDataParallel takes torch's arguments (module, then "
                            f"{', '.join(known)}): {error}") from None
        if group.arguments.get("process_group") is None and not is_distributed():
            # torch said "Default process group has not been initialized" without the way out
            raise RuntimeError("DistributedDataParallel needs a process group; call "
                               "nnsparse.distributed.init_from_env() under torchrun, or use "
                               "nnsparse.distributed.wrap(model), which returns the model "
                               "itself in one process")
        _refuse_in_backward(module)
        if sparse_grad_parameters(module) and not hasattr(_TORCH_DDP, "_build_params_for_reducer"):
            # torch has no public way to declare a sparse gradient; this is the one place
            # DDP decides it.  Without it a sparse gradient fails deep inside backward.
            raise NotImplementedError(
                f"module: this torch ({torch.__version__}) gives nnsparse no way to declare "
                "sparse gradients to DistributedDataParallel; use sparse_grad=False")
        super().__init__(module, *args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True,
                        assign: bool = False) -> _IncompatibleKeys:
        """``nn.Module.load_state_dict`` (keys ``module.*``), checked whole first: a refused
        load changes nothing (torch's copied every entry it could into the wrapped model
        before it raised), and a state without the ``module.`` prefix is named as such."""
        strict, assign = check_state_dict(self, state_dict, strict, assign)
        return cast(_IncompatibleKeys,
                    super().load_state_dict(state_dict, strict=strict, assign=assign))

    def _build_params_for_reducer(  # torch's hook point: (parameters, expect_sparse)
            self) -> Tuple[List[nn.Parameter], List[bool]]:
        parameters, expect_sparse = (
            super()._build_params_for_reducer())  # type: ignore[no-untyped-call]
        ours = {id(p) for p in sparse_grad_parameters(self.module)}
        return parameters, [e or id(p) in ours for p, e in zip(parameters, expect_sparse)]


def _gather_sparse(grad: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """The mean over ranks of a sparse COO ``grad``, by two all-gathers (sizes, then entries)."""
    grad = grad.coalesce()
    index, values = grad.indices(), grad.values()
    nnz = torch.tensor([index.shape[1]], device=values.device)
    sizes = [torch.empty_like(nnz) for _ in range(world)]
    dist.all_gather(sizes, nnz, group=group)
    counts = torch.cat(sizes).tolist()  # the one host sync: buffers need a size
    most = max(counts)
    # Every rank sends one (sparse_dim + dense values) block padded to ``most`` entries.
    pad_index = index.new_zeros(index.shape[0], most)
    pad_index[:, :counts[dist.get_rank(group)]] = index
    pad_values = values.new_zeros((most,) + tuple(values.shape[1:]))
    pad_values[:index.shape[1]] = values
    all_index = [torch.empty_like(pad_index) for _ in range(world)]
    all_values = [torch.empty_like(pad_values) for _ in range(world)]
    dist.all_gather(all_index, pad_index, group=group)
    dist.all_gather(all_values, pad_values, group=group)
    index = torch.cat([i[:, :n] for i, n in zip(all_index, counts)], dim=1)
    values = torch.cat([v[:n] for v, n in zip(all_values, counts)]).div_(world)
    return torch.sparse_coo_tensor(index, values, grad.shape).coalesce()


# (the ignores: torch.distributed imports the public GradBucket without re-exporting it)
def sparse_allgather_hook(process_group: Optional[dist.ProcessGroup],
                          bucket: dist.GradBucket,  # type: ignore[name-defined]
                          ) -> torch.futures.Future[torch.Tensor]:
    # (Annotations evaluated, not postponed: DDP compares them with these types.)
    r"""A DDP comm hook for backends without sparse all-reduce (NCCL).

    A dense bucket is averaged by all-reduce, as DDP does without a hook.
    A sparse gradient is averaged by all-gathering every rank's (coalesced)
    indices and values, padded to the largest nnz, and summing: the traffic
    is ``world_size * max nnz`` entries per rank, never the dense table.
    The result is a coalesced sparse gradient, the same on every rank.

    Register it with ``ddp.register_comm_hook(None, sparse_allgather_hook)``
    (:func:`wrap` does it on NCCL).  It works on gloo too (the tests run it there).

    Raises:
        TypeError: ``bucket`` is not a DDP ``GradBucket`` (DDP passes one).
    """
    if not isinstance(bucket, dist.GradBucket):  # type: ignore[attr-defined]
        raise TypeError(f"bucket must be the torch.distributed.GradBucket DDP passes to a comm "
                        f"hook, got {type(bucket).__name__}; register the hook with "
                        f"ddp.register_comm_hook(None, sparse_allgather_hook)")
    grad = bucket.buffer()
    world = dist.get_world_size(process_group)
    if not grad.is_sparse:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        # torch annotates ProcessGroup but takes None as the default group
        return allreduce_hook(cast(dist.ProcessGroup, process_group), bucket)
    out = _gather_sparse(grad, process_group, world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(
        devices=[out.device] if out.device.type == "cuda" else None)
    future.set_result(out)
    return future


def wrap(model: nn.Module, *, sparse_allgather: Optional[bool] = None,
         **ddp_kwargs: Any) -> nn.Module:
    r"""``model`` in :class:`DistributedDataParallel`, or ``model`` itself in one process.

    Args:
        model (nn.Module): on this process's device (from :func:`init_from_env`).
        sparse_allgather (bool, optional): reduce sparse gradients with
            :func:`sparse_allgather_hook`.  Default: on NCCL (which has no
            sparse all-reduce) when the model has sparse gradients; gloo
            all-reduces them itself.
        **ddp_kwargs: passed to DDP (``device_ids`` defaults to the model's
            CUDA device).

    Returns:
        nn.Module: the wrapped model (``unwrap`` gives the original back); ``model``
        itself without a process group.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``sparse_allgather`` is not
            None or a bool, or ``ddp_kwargs`` holds a name DDP does not take
            (checked without a process group too).
        NotImplementedError: NCCL, sparse gradients and ``sparse_allgather=False``:
            NCCL cannot all-reduce sparse tensors; use the hook, gloo, or
            ``sparse_grad=False``.  And :class:`DistributedDataParallel`'s refusals
            (an optimiser in the backward).

    Example::

        >>> model = nnsparse.SparseLinearBatch(5, 3, sparse_grad=True)
        >>> wrapped = nnsparse.distributed.wrap(model)   # one process: the model itself
        >>> wrapped is model and nnsparse.distributed.unwrap(wrapped) is model
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if sparse_allgather is not None:  # numpy bools pass (they said "got bool")
        sparse_allgather = as_flag(sparse_allgather, "sparse_allgather", "None or a bool")
    unknown = sorted(set(ddp_kwargs) - set(inspect.signature(_TORCH_DDP.__init__).parameters))
    if unknown:  # checked without a process group too: a typo would only fail under torchrun
        raise TypeError(f"ddp_kwargs must be DistributedDataParallel's arguments, got unknown "
                        f"{unknown}")
    if not is_distributed():
        return model
    sparse = bool(sparse_grad_parameters(model))
    nccl = dist.get_backend() == "nccl"
    if sparse_allgather is None:
        sparse_allgather = sparse and nccl
    if sparse and nccl and not sparse_allgather:
        raise NotImplementedError(
            "NCCL has no all-reduce for sparse gradients (layers with sparse_grad=True); "
            "use sparse_allgather=True, the gloo backend, or sparse_grad=False")
    param = next(model.parameters(), None)
    if param is not None and param.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [param.device])
    ddp = DistributedDataParallel(model, **ddp_kwargs)
    if sparse_allgather:
        ddp.register_comm_hook(None, sparse_allgather_hook)
    return ddp


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper.

    Args:
        model (nn.Module): a ``DistributedDataParallel`` (torch's or this module's)
            or any module.

    Returns:
        nn.Module: ``model.module`` for a DDP wrapper, else ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return model.module if isinstance(model, _TORCH_DDP) else model
