"""``Batchifier``: run a network over a data set too large for one forward."""
from __future__ import annotations

import contextlib
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union,
                    cast)

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from .. import _index
from .._forms import (SparseBatch, _sparse_coo, _sparse_csr, as_count, as_device, as_flag,
                      as_sparse_batch, check_kernel_dtype, refuse_meta, refuse_meta_device,
                      trust)
from .._lua import LuaField
from ..data.dataset import SparseRowDataset

__all__ = ["Batchifier"]

_Device = Union[str, torch.device, None]
_Data = Union[Tensor, Sequence[Tensor], Dataset[Any]]
_Pattern = Tuple[Tensor, Tensor]
_NO_PATTERN = ("exclude=True needs sparse batches to take the rated items from, got dense ones; "
               "pass the items to exclude as a sparse matrix")


def _build(crow: Tensor, col: Tensor, values: Tensor, width: int, layout: torch.layout) -> Tensor:
    """A coalesced sparse ``(rows, width)`` batch of ``layout`` from coalesced CSR parts."""
    size = (crow.shape[0] - 1, width)
    if layout == torch.sparse_csr:  # built by nnsparse from checked parts: trusted
        return trust(_sparse_csr(crow, col, values, size))
    return trust(_sparse_coo(torch.stack([_rows_of(crow, col), col]), values, size,
                             coalesced=True))


def _rows_of(crow: Tensor, col: Tensor) -> Tensor:
    """The row index of each entry, from CSR row pointers."""
    return _index.rows_from_crow(crow, col.shape[0])


def _move(x: Any, device: Optional[torch.device]) -> Any:
    """``x`` on ``device``: a tensor, anything with a ``.to``, or a list/tuple of those."""
    if device is None:
        return x
    if hasattr(x, "to"):  # a tensor, or a batch class that knows how to move itself
        return x.to(device)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return type(x)(*(_move(v, device) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_move(v, device) for v in x)
    return x


def _input_width(network: nn.Module) -> Optional[int]:
    """The ``in_features`` of the first module of ``network`` that has one (the layer that
    reads the data), or None."""
    for module in network.modules():
        width = getattr(module, "in_features", None)
        if isinstance(width, int):
            return width
    return None


class _SparseRows:
    """Row ranges of a sparse matrix cut at its CSR row pointers: each batch is
    a slice of the column and value arrays, never a gather over the whole nnz."""

    def __init__(self, batch: SparseBatch, coalesce: bool) -> None:
        if coalesce and batch.form != "csr":  # a torch CSR tensor is coalesced already
            batch = batch.coalesce()
        self.batch = batch.sorted_by_row()
        self.crow = self.batch.crow_indices()
        # One transfer of the rows + 1 pointers, so cutting a batch never syncs a GPU.
        self.crow_host = self.crow.cpu()

    def parts(self, start: int, stop: int, device: Optional[torch.device]
              ) -> Tuple[Tensor, Tensor, Tensor]:
        """``(crow, col, values)`` of rows ``[start, stop)``, rows renumbered from 0."""
        lo, hi = int(self.crow_host[start]), int(self.crow_host[stop])
        crow = self.crow[start:stop + 1] - lo
        # (slices of inference data are copied: torch cannot build a batch on them)
        col = _index.outside_inference(self.batch.col[lo:hi])
        values = _index.outside_inference(self.batch.values[lo:hi])
        return _move(crow, device), _move(col, device), _move(values, device)

    def pattern(self, start: int, stop: int, device: Optional[torch.device]) -> _Pattern:
        """``(row, col)`` of the entries of rows ``[start, stop)``, rows renumbered from 0."""
        lo, hi = int(self.crow_host[start]), int(self.crow_host[stop])
        crow = _move(self.crow[start:stop + 1] - lo, device)
        col = _move(self.batch.col[lo:hi], device)
        return _rows_of(crow, col), col


class _Source:
    """What the loop needs of the data: its row count, where the result goes,
    the batch of a row range and that batch's pattern (for ``exclude=True``)."""

    rows: int
    device: torch.device  # where the results are allocated
    dtype: torch.dtype  # of an empty result (no batch ran)

    width: Optional[int]  # None when only the batches tell it

    def batch(self, start: int, stop: int) -> Any:
        raise NotImplementedError


class _SparseSource(_Source):
    def __init__(self, data: Any, runner: "Batchifier") -> None:
        self.target, self.layout = runner.device, runner.layout
        if isinstance(data, (list, tuple)) and not data:  # no rows, and no width to tell
            self.cut, self.rows, self.width = None, 0, None
            self.device, self.dtype = torch.device("cpu"), torch.get_default_dtype()
            return
        with torch.no_grad():  # the one normalisation, once for every batch
            batch = as_sparse_batch(data, name="data")
        check_kernel_dtype(batch.dtype, "data values")  # before the batch is coalesced
        if batch.is_vector:
            raise ValueError("data must be a batch (rows, width), got a single vector; "
                             "call the network on it directly")
        self.cut = _SparseRows(batch, coalesce=True) if batch.rows else None
        self.rows, self.device, self.width = batch.rows, batch.device, batch.width
        if batch.form == "pair_list":  # Lua's rows tell no width: the one the network reads
            self.width = max(self.width, _input_width(runner.network) or 0)
        self.dtype = batch.dtype if batch.dtype.is_floating_point else torch.get_default_dtype()

    def batch(self, start: int, stop: int) -> Tensor:
        # cut and width are None only for no rows, when no batch is asked for
        assert self.cut is not None and self.width is not None
        crow, col, values = self.cut.parts(start, stop, self.target)
        return _build(crow, col, values, self.width, self.layout)

    def pattern(self, start: int, stop: int, batch: Tensor) -> _Pattern:
        # Read from the batch the network received: already on its device.
        if batch.layout == torch.sparse_csr:
            return _rows_of(batch.crow_indices(), batch.col_indices()), batch.col_indices()
        row, col = batch._indices()
        return row, col


class _DenseSource(_Source):
    def __init__(self, data: Tensor, runner: "Batchifier") -> None:
        if data.dim() != 2:
            raise ValueError(f"data must be a 2-D (rows, width) tensor, got shape "
                             f"{tuple(data.shape)}")
        self.data, self.rows, self.device, self.target = data, data.shape[0], data.device, runner.device
        self.dtype = data.dtype if data.is_floating_point() else torch.get_default_dtype()
        self.width = data.shape[1]

    def batch(self, start: int, stop: int) -> Tensor:
        return cast(Tensor, _move(self.data[start:stop], self.target))


class _DatasetSource(_Source):
    def __init__(self, data: Dataset[Any], runner: "Batchifier") -> None:
        if not hasattr(data, "__len__"):
            raise TypeError(f"data must be a map-style Dataset with a length, got "
                            f"{type(data).__name__} without __len__")
        self.data, self.rows, self.target = data, len(data), runner.device
        self.device, self.dtype, self.width = torch.device("cpu"), torch.get_default_dtype(), None
        self.collate = runner.collate_fn or _default_collate(data, runner.layout)
        self.output_size = runner.output_size

    def batch(self, start: int, stop: int) -> Any:
        return _move(self.collate([self.data[i] for i in range(start, stop)]), self.target)

    def pattern(self, start: int, stop: int, batch: Any) -> _Pattern:
        if isinstance(batch, Tensor) and batch.layout == torch.strided:
            raise TypeError(_NO_PATTERN)
        b = as_sparse_batch(batch, name="exclude=True: the collated batch")
        if b.width > self.output_size:  # checked here: a Dataset tells its width batch by batch
            raise ValueError(f"exclude=True needs the data's columns to be output columns: "
                             f"a batch of width {b.width} is larger than output_size "
                             f"{self.output_size}")
        return b.row, b.col


def _default_collate(data: Dataset[Any], layout: torch.layout) -> Callable[[List[Any]], Any]:
    """The collation of ``data``'s items when no ``collate_fn`` is given: a
    :class:`~nnsparse.data.SparseRowDataset`'s own (the input rows, as wide as
    its matrix), also for a ``Subset`` of one (``torch.utils.data.random_split``'s
    parts hand out its items), otherwise sparse vectors or pair tensors stacked
    (:func:`_collate`)."""
    base = data
    while isinstance(base, Subset):
        base = base.dataset
    if isinstance(base, SparseRowDataset):
        rows = base
        return lambda items: _relayout(rows.collate(items).input, layout)
    return lambda items: _collate(items, layout)


def _relayout(batch: Tensor, layout: torch.layout) -> Tensor:
    """A trusted coalesced batch in ``layout`` (the same entries, still trusted)."""
    if batch.layout == layout:
        return batch
    return trust(batch.to_sparse_csr() if layout == torch.sparse_csr
                 else batch.to_sparse_coo())  # type: ignore[no-untyped-call]


def _collate(items: List[Any], layout: torch.layout) -> Tensor:
    """The default collation: sparse vectors or pair tensors into one sparse batch."""
    bad = next((item for item in items if not isinstance(item, Tensor)), None)
    if bad is not None:  # e.g. a TensorDataset's (x,) tuples: the caller knows their layout
        raise TypeError(f"the dataset's items must be sparse vectors or (k, 2) pair tensors "
                        f"for the default collation, got {type(bad).__name__}; pass "
                        f"collate_fn= to build a batch from them (for a TensorDataset: "
                        f"collate_fn=lambda items: torch.stack([x for x, in items]))")
    batch = as_sparse_batch(items, name="the dataset's items").coalesce()
    return _build(batch.crow_indices(), batch.col, batch.values, batch.width, layout)


@contextlib.contextmanager
def _evaluating(network: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd inside; each module's own mode restored after.

    Only the network (and the scoring of its output) runs under inference mode:
    cutting and collating the data stays out of it, since some sparse ops
    (``torch.stack`` of sparse vectors in a user's ``collate_fn``) fail on
    inference tensors.
    """
    modes = [(m, m.training) for m in network.modules()]
    network.eval()
    try:
        with torch.no_grad():
            yield
    finally:  # each module's own mode, so a frozen submodule stays in eval
        for module, training in modes:
            module.training = training


def _allocate(shape: Tuple[int, int], dtype: torch.dtype, device: torch.device) -> Tensor:
    # Made outside inference mode: a normal tensor, usable later in autograd.
    return torch.empty(shape, dtype=dtype, device=device)


def _checked_settings(network: Any, output_size: Any, batch_size: Any, device: Any,
                      progress: Any, layout: Any, collate_fn: Any, present: bool = True
                      ) -> Tuple[int, int, Any, Any]:
    """A Batchifier's settings checked; ``(output_size, batch_size, device, progress)``
    as stored (numpy ints as ints, a device name as a ``torch.device``).  ``present=False``
    (a loaded Batchifier): a device this machine lacks is kept, and refused at a call."""
    if not isinstance(network, nn.Module):
        raise TypeError(f"network must be an nn.Module, got {type(network).__name__}")
    output_size = as_count("output_size", output_size, 0)  # (as nn.Linear's)
    batch_size = as_count("batch_size", batch_size, 1)
    if progress is not None:
        progress = as_flag(progress, "progress", "a bool or None")
    device = as_device(device, none=True, present=present)
    # (the output is filled with the network's numbers: on the meta device torch's sparse
    # kernels failed with "Could not run 'aten::addmm.out' ... 'SparseCsrMeta' backend")
    refuse_meta_device(device)
    if layout not in (torch.sparse_csr, torch.sparse_coo):
        raise TypeError(f"layout must be torch.sparse_csr or torch.sparse_coo, got {layout}")
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
    return output_size, batch_size, device, progress


# The attributes a Batchifier holds: its constructor's arguments
_SETTINGS = ("network", "output_size", "batch_size", "device", "progress", "layout",
             "collate_fn")


class Batchifier:
    r"""Run a network over a data set too large to push through at once.

    The data is cut into row ranges of ``batch_size`` rows, never densified as
    a whole; each batch runs through ``network`` under
    :func:`torch.inference_mode` with the network in eval mode (each module's
    train/eval mode is restored afterwards, also after an exception), and its
    output is written into one result allocated at the first batch.  Peak
    memory beyond the data and the result is bounded by ``batch_size``, not by
    the number of rows.  The Lua ``nnsparse.Batchifier``.

    Args:
        network (nn.Module): maps a batch of ``b`` rows to a dense
            ``(b, output_size)`` tensor.
        output_size (int): the width of the network's output.
        batch_size (int): the number of rows per forward. Default: 256.
        device (torch.device or str, optional): the network's device; each
            batch is moved there before the forward.  Default: none, batches
            stay on the data's device.
        progress (bool or None): show a tqdm bar on stderr, counting rows;
            ``None``: only when stderr is a terminal (tqdm's rule).  Default: ``True``.
        layout (torch.layout): the layout of the batches cut from sparse
            data: ``torch.sparse_csr`` (default) or ``torch.sparse_coo``
            (coalesced).  Every nnsparse layer accepts both.
        collate_fn (callable, optional): for a :class:`~torch.utils.data.Dataset`
            only: turns a list of items into the batch the network takes.
            Default: a :class:`~nnsparse.data.SparseRowDataset`'s input rows
            (its own ``collate``, in ``layout``), also for a ``Subset`` of one
            (a part of ``torch.utils.data.random_split``); for another dataset, the
            items are sparse vectors ``(width,)`` or ``(k, 2)`` pair tensors,
            stacked into a sparse batch of ``layout``.

    What the network receives, by kind of data:

    - a sparse matrix ``(rows, width)`` (COO, coalesced or not, or CSR), or a
      list of sparse vectors or of pair tensors: a coalesced sparse
      ``(b, width)`` batch of ``layout``, sliced from the data normalised
      once (an uncoalesced COO matrix or a list is coalesced once, in O(nnz)
      memory);
    - a dense ``(rows, width)`` tensor: its row slice ``data[start:stop]``;
    - a map-style :class:`~torch.utils.data.Dataset` of ``len(data)`` rows:
      ``collate_fn([data[i] for i in range(start, stop)])``.  With the default
      collation, a batch of pair tensors is as wide as its largest index + 1
      (nnsparse layers accept batches narrower than their ``in_features``).

    The results are on the data's device (the CPU for a ``Dataset``), where a
    result as large as the data fits, whatever ``device`` the network runs on;
    each batch's output is copied there.

    Raises:
        TypeError: ``network`` is not an ``nn.Module``, ``output_size`` or
            ``batch_size`` is not an int, ``progress`` is not a bool or None,
            ``layout`` is neither sparse layout, ``collate_fn`` is not callable,
            ``device`` is not a device; in :meth:`forward` and :meth:`topk`, theirs.
        ValueError: a negative ``output_size``, a ``batch_size`` below 1, an
            unknown device name, the meta device (which holds no numbers to
            return).

    Example::

        >>> net = torch.nn.Sequential(nnsparse.Densify(3), torch.nn.Linear(3, 2))
        >>> with torch.no_grad():
        ...     _ = net[1].weight.copy_(torch.tensor([[1., 0., 0.], [0., 1., 1.]]))
        ...     _ = net[1].bias.zero_()
        >>> data = torch.tensor([[1., 0., 0.], [0., 2., 3.], [4., 0., 5.]]).to_sparse_csr()
        >>> run = nnsparse.Batchifier(net, output_size=2, batch_size=2, progress=False)
        >>> run(data)
        tensor([[1., 0.],
                [0., 5.],
                [4., 5.]])
        >>> run.topk(data, k=1)
        torch.return_types.topk(
        values=tensor([[1.],
                [5.],
                [5.]]),
        indices=tensor([[0],
                [1],
                [1]]))
    """

    # Lua's Batchifier(network, outputSize) kept self.outputSize (its README names the
    # argument inputSize, but it is the width of the network's output): reading or
    # assigning it names output_size (an attribute outputSize would change nothing)
    outputSize = LuaField("output_size", "batchifier")

    def __init__(self, network: nn.Module, output_size: int, batch_size: int = 256,
                 device: _Device = None, progress: Optional[bool] = True,
                 layout: torch.layout = torch.sparse_csr,
                 collate_fn: Optional[Callable[[List[Any]], Any]] = None) -> None:
        output_size, batch_size, device, progress = _checked_settings(
            network, output_size, batch_size, device, progress, layout, collate_fn)
        self.network = network
        self.output_size = output_size
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else None
        self.progress = progress
        self.layout = layout
        self.collate_fn = collate_fn

    def __setstate__(self, state: Dict[str, Any]) -> None:
        # (pickle, copy.deepcopy, torch.load(weights_only=False); the default weights_only
        # load refuses the class, which holds a user's network) the constructor's checks
        # of a file's settings, before the object holds them: a field edited or missing
        # failed only at the first call (a missing one with Python's AttributeError).  Not
        # the device's presence: one pickled on a GPU machine loads on a CPU-only one (the
        # call refuses it there; set device = None or 'cpu' to run it)
        if not isinstance(state, dict):
            raise TypeError(f"a loaded Batchifier's state must be a dict of its settings, got "
                            f"{type(state).__name__}")
        missing = [k for k in _SETTINGS if k not in state]
        if missing:
            raise ValueError(f"a loaded Batchifier's state lacks the settings {missing} (it "
                             f"holds {sorted(state)})")
        try:
            output_size, batch_size, device, progress = _checked_settings(
                state["network"], state["output_size"], state["batch_size"], state["device"],
                state["progress"], state["layout"], state["collate_fn"], present=False)
        except (TypeError, ValueError) as error:
            raise type(error)(f"a loaded Batchifier's settings: {error}") from None
        self.__dict__.update(state, output_size=output_size, batch_size=batch_size,
                             device=device, progress=progress)

    def _check_settings(self) -> None:
        """The settings again, as the constructor checked them: they may have been assigned
        since (``network = None`` failed with "'NoneType' object has no attribute
        'modules'", a str ``output_size`` with a shape message quoting it)."""
        _checked_settings(self.network, self.output_size, self.batch_size, self.device,
                          self.progress, self.layout, self.collate_fn)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"batch_size={self.batch_size}, device={self.device}, "
                f"network={type(self.network).__name__})")

    def forward(self, data: _Data, batch_size: Optional[int] = None, *args: Any) -> Tensor:
        r"""The network's output for every row of ``data``.

        Args:
            data: a sparse matrix ``(rows, width)`` (COO or CSR), a list of
                sparse vectors or of pair tensors, a dense ``(rows, width)``
                tensor, or a map-style :class:`~torch.utils.data.Dataset`.
            batch_size (int, optional): the rows per forward for this call
                only (Lua's ``forward(data, batchSize)``). Default: the
                ``batch_size`` the Batchifier was built with.

        Returns:
            A dense ``(rows, output_size)`` tensor of the network's output
            dtype on the data's device (with no rows: the data's floating
            dtype, or the default dtype).  A normal tensor, not an inference
            tensor.

        Raises:
            TypeError: ``data`` is not one of the accepted kinds, ``batch_size``
                not an int, a third positional argument (Lua's ``nFrame``); the
                network returns something else than a dense tensor (a tuple,
                ``None``, a sparse tensor).
            ValueError: ``data`` is a single vector, the network returns a
                tensor of another shape than ``(b, output_size)``, one without
                data (or another dtype than for the first batch), or
                ``batch_size`` is below 1.

        The settings (``network``, ``output_size``, ``layout``...) are checked
        again at each call, with the constructor's messages: they may have been
        assigned since.
        """
        if args:  # Lua's forward(data, batchSize, nFrame): Python's "takes from 2 to 3 ..."
            raise TypeError(f"Batchifier.forward takes (data, batch_size), got {len(args)} more "
                            f"positional argument(s) {args!r}; Lua's nFrame has no equivalent "
                            f"(the number of rows is the data's)")
        self._check_settings()
        if batch_size is None:
            batch_size = self.batch_size
        batch_size = as_count("batch_size", batch_size, 1)
        source = self._source(data)
        out: Optional[Tensor] = None
        with _evaluating(self.network):
            for start, stop in self._ranges(source.rows, "forward", batch_size):
                y = self._run(source.batch(start, stop), start, stop,
                              None if out is None else out.dtype)
                if out is None:
                    out = _allocate((source.rows, self.output_size), y.dtype, source.device)
                out[start:stop].copy_(y)
        if out is None:
            out = _allocate((source.rows, self.output_size), source.dtype, source.device)
        return out

    __call__ = forward

    def topk(self, data: _Data, k: int, exclude: Any = None,
             candidates: Optional[Tensor] = None) -> "torch.return_types.topk":
        r"""The ``k`` best output columns of each row, never holding all the outputs.

        Each batch's ``(b, output_size)`` output is reduced to its top ``k``
        before the next batch runs: the recommendation step on a catalogue too
        large to score densely.

        Args:
            data: as for :meth:`forward`.
            k (int): how many columns per row, ``0 <= k <= output_size``.
            exclude: ``None`` or ``False``: rank every column.  ``True``: leave
                out each row's specified input entries (the items a user has
                already rated); needs sparse data, or a ``Dataset`` collated
                into sparse batches, whose columns are output columns.  A
                sparse matrix ``(rows, width <= output_size)`` in any accepted
                form: leave out its pattern (its values are ignored, explicit
                zeros count).  Left-out entries score ``-inf`` (the dtype's
                minimum for integer scores) before the top ``k`` is taken.
            candidates (Tensor, optional): bool ``(output_size,)``, the columns
                that may be ranked at all (e.g. items with enough ratings to
                trust their prediction); the others score ``-inf`` (or the
                integer minimum) in every row.  Default: every column.

        Returns:
            ``torch.return_types.topk(values, indices)``, as :func:`torch.topk`
            gives, each ``(rows, k)``, values in decreasing order, on the
            data's device.  A row with fewer than ``k`` columns left after
            exclusion is completed with ``-inf`` values whose indices are
            distinct excluded columns in no set order: keep
            ``values.isfinite()``.

        Raises:
            ValueError: ``k`` out of range; ``exclude`` with another number of
                rows or wider than ``output_size``; ``exclude=True`` on data
                wider than ``output_size``.
            TypeError: ``k`` not an int; ``exclude`` of a wrong kind, or ``exclude=True`` on
                dense batches; ``candidates`` not a dense bool tensor; a network
                whose scores are bool or complex (they have no order) or
                uint16/32/64 (``torch.topk`` lacks them).
            ValueError: ``candidates`` not of shape ``(output_size,)``.
            The network's output is checked as by :meth:`forward` (a TypeError
            for another kind than a dense tensor, a ValueError for another shape).
        """
        self._check_settings()
        k = as_count("k", k, 0, must="non-negative")  # (as torch.topk's)
        if candidates is not None:
            if not isinstance(candidates, Tensor) or candidates.dtype != torch.bool:
                raise TypeError(f"candidates must be a bool tensor, got "
                                f"{candidates.dtype if isinstance(candidates, Tensor) else type(candidates).__name__}")
            if candidates.layout != torch.strided:
                raise TypeError(f"candidates must be a dense bool tensor, got layout "
                                f"{candidates.layout}")
            if candidates.shape != (self.output_size,):
                raise ValueError(f"candidates must have shape ({self.output_size},) "
                                 f"(output_size), got {tuple(candidates.shape)}")
            refuse_meta(candidates, "candidates")
        if k > self.output_size:
            raise ValueError(f"k must be at most output_size ({self.output_size}), got {k}")
        source = self._source(data)
        pattern = self._exclusion(exclude, source)
        values: Optional[Tensor] = None
        indices: Optional[Tensor] = None
        with _evaluating(self.network):
            for start, stop in self._ranges(source.rows, "topk"):
                batch = source.batch(start, stop)
                y = self._run(batch, start, stop, None if values is None else values.dtype)
                left_out = pattern(start, stop, batch) if pattern is not None else None
                worst = _worst_score(y.dtype)
                with torch.inference_mode():
                    if left_out is not None:
                        y = y.index_put(tuple(i.to(y.device) for i in left_out),
                                        y.new_full((), worst))
                    if candidates is not None:
                        y = y.masked_fill(~candidates.to(y.device), worst)
                    best = torch.topk(y, k, dim=1)
                if values is None:
                    values = _allocate((source.rows, k), y.dtype, source.device)
                    indices = _allocate((source.rows, k), torch.int64, source.device)
                assert indices is not None  # allocated with values
                values[start:stop].copy_(best.values)
                indices[start:stop].copy_(best.indices)
        if values is None:
            values = _allocate((source.rows, k), source.dtype, source.device)
            indices = _allocate((source.rows, k), torch.int64, source.device)
        assert indices is not None  # allocated with values
        return torch.return_types.topk((values, indices))

    # -- helpers ---------------------------------------------------------------
    def _source(self, data: _Data) -> _Source:
        if isinstance(data, Dataset):
            return _DatasetSource(data, self)
        if isinstance(data, Tensor) and data.layout == torch.strided:
            return _DenseSource(data, self)
        if isinstance(data, (Tensor, list, tuple)):
            return _SparseSource(data, self)
        raise TypeError(f"data must be a sparse matrix, a list of sparse rows, a dense tensor "
                        f"or a Dataset, got {type(data).__name__}")

    def _ranges(self, rows: int, what: str,
                batch_size: Optional[int] = None) -> Iterator[Tuple[int, int]]:
        """``(start, stop)`` of each batch, with a progress bar counting rows."""
        from tqdm import tqdm  # imported where the bar is made

        step = self.batch_size if batch_size is None else batch_size
        # None: tqdm's own rule, a bar only when stderr is a terminal
        disable = None if self.progress is None else not self.progress
        with tqdm(total=rows, disable=disable, unit="row",
                  desc=f"{type(self).__name__}.{what}") as bar:
            for start in range(0, rows, step):
                stop = min(start + step, rows)
                yield start, stop
                bar.update(stop - start)

    def _exclusion(self, exclude: Any, source: _Source
                   ) -> Optional[Callable[[int, int, Any], _Pattern]]:
        """The pattern to leave out of each batch, as ``(start, stop, batch) -> (row, col)``."""
        if isinstance(exclude, np.bool_):  # a numpy bool is a flag, as elsewhere (as_flag)
            exclude = bool(exclude)
        if exclude is None or exclude is False:
            return None
        if exclude is True:
            if isinstance(source, _DenseSource):
                raise TypeError(_NO_PATTERN)
            if source.width is not None and source.width > self.output_size:
                raise ValueError(f"exclude=True needs the data's columns to be output columns: "
                                 f"width {source.width} is larger than output_size "
                                 f"{self.output_size}")
            # the sources with a pattern: the dense one is refused above
            assert isinstance(source, (_SparseSource, _DatasetSource))
            return source.pattern
        if isinstance(exclude, Tensor) and exclude.layout == torch.strided:
            raise TypeError("exclude must be None, a bool or a sparse matrix "
                            "(rows, output_size), got a dense tensor")
        if not isinstance(exclude, (Tensor, list, tuple)):
            raise TypeError(f"exclude must be None, a bool or a sparse matrix "
                            f"(rows, output_size), got {type(exclude).__name__} {exclude!r}")
        with torch.no_grad():
            batch = as_sparse_batch(exclude, name="exclude", width=self.output_size,
                                    bound="output_size")
        if batch.is_vector or batch.rows != source.rows:
            got = "a vector" if batch.is_vector else f"{batch.rows} rows"
            raise ValueError(f"exclude must have the data's {source.rows} rows, got {got}")
        cut = _SparseRows(batch, coalesce=False) if batch.rows else None

        def left_out(start: int, stop: int, _: Any) -> _Pattern:
            assert cut is not None  # None only for no rows, when no batch runs
            return cut.pattern(start, stop, self.device)
        return left_out

    def _run(self, batch: Any, start: int, stop: int, dtype: Optional[torch.dtype]) -> Tensor:
        """The network's output for one batch, checked to be ``(stop - start, output_size)``
        with data and, after the first batch, the first batch's ``dtype`` (the result's:
        another would be cast into it silently, a float score truncated to an int one)."""
        with torch.inference_mode():
            y = self.network(batch)
        expected = (stop - start, self.output_size)
        if not isinstance(y, Tensor) or y.layout != torch.strided:  # a wrong kind, a TypeError
            got = (f"shape {tuple(y.shape)}, layout {y.layout}" if isinstance(y, Tensor)
                   else type(y).__name__)
            raise TypeError(f"network must return a dense tensor of shape {expected}, got {got}")
        if tuple(y.shape) != expected:
            raise ValueError(f"network must return a dense tensor of shape {expected}, got "
                             f"shape {tuple(y.shape)}, layout {y.layout}")
        if y.device.type == "meta":
            raise ValueError("network must return a tensor that holds data, got one on the meta "
                             "device")
        if dtype is not None and y.dtype != dtype:
            raise ValueError(f"network must return one dtype for every batch: {dtype} for the "
                             f"first, got {y.dtype} for rows [{start}, {stop})")
        return y


def _worst_score(dtype: torch.dtype) -> float:
    """What a left-out column scores: ``-inf``, or an integer dtype's minimum."""
    if dtype.is_floating_point:
        return float("-inf")
    if dtype == torch.bool or dtype.is_complex:
        raise TypeError(f"topk ranks real scores, the network returned dtype {dtype}")
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        raise TypeError(f"topk ranks scores of a dtype torch.topk takes, the network returned "
                        f"dtype {dtype}; return them as torch.int64 or a floating dtype")
    return torch.iinfo(dtype).min
