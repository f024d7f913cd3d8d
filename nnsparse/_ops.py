"""The sparse products as ``torch.library`` custom operators, for ``torch.compile``.

dynamo cannot take a torch sparse tensor (COO or CSR) as a graph input, so a
compiled model receives its sparse batch as plain tensors: a
:class:`SparseParts` (CSR row pointers, column indices, values, size), made
once per batch, in eager code, by :func:`sparse_parts`.  The layers route such
an input to the custom operators below, which the compiler sees as single
opaque nodes with known output shapes (the ``register_fake`` functions), so
``torch.compile(model, fullgraph=True)`` traces the whole model with a
dynamic number of specified entries (nnz).

Operators (all functional; ``crow``/``col`` int64, ``values`` of the dense
operands' dtype; the pattern's positions are distinct and grouped by row):

- ``nnsparse::sparse_mm(crow, col, values, table, bias, check=False)``:
  ``S @ table + bias``, ``(rows, d)``, for ``S`` the ``(rows, n)`` CSR matrix and
  ``table`` ``(n, d)``;
- ``nnsparse::sampled_mm(h, table, bias, crow, col, check=False)``:
  ``(h @ table.T + bias)`` at the pattern's entries, ``(nnz,)``;
- ``nnsparse::sparse_t_mm(crow, col, values, dense, n)``: ``S.T @ dense``,
  ``(n, d)``, the weight gradients of both.

``check=True`` (the layers' forward calls) checks a pattern not marked checked
(parts built by hand), once, on the real tensors: the one check that runs in a
compiled model, whose tracing skips the layers' own.  Each is the other's gradient: the backward of ``sparse_mm`` is a
``sampled_mm`` (values) and a ``sparse_t_mm`` (table), the backward of
``sampled_mm`` a ``sparse_mm`` (h) and a ``sparse_t_mm`` (table), so second
passes through the compiler meet the same three nodes.  Gradients are dense
(``sparse_grad`` layers are not compilable: torch's fake tensors have no
sparse results).

Under ``torch.autocast`` the operators run in float32 (floating inputs of a
lower precision are cast up, float64 is left alone), as torch treats its own
sparse and ``embedding_bag`` kernels: see ``docs/compile_amp.md``.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple, cast

import torch
from torch import Tensor

from . import _index
from ._forms import (SparseBatch, _check_csr, _dtype_hint, _operand_dtype_hint, _version,
                     as_device, as_flag, as_sparse_batch, check_kernel_dtype, compile_boundary)
from ._kernels import _sampled_by_column, _sampled_rows, _t_mm, _table_blocks, _table_mm

__all__ = ["SparseParts", "sparse_parts"]


class SparseParts(NamedTuple):
    """A sparse ``(rows, width)`` batch as plain tensors: what a compiled model receives.

    Attributes:
        crow (Tensor): int64 ``(rows + 1,)`` CSR row pointers.
        col (Tensor): int64 ``(nnz,)`` column indices, distinct and increasing within a row.
        values (Tensor): ``(nnz,)`` values (may require grad).
        size (Tuple[int, int]): ``(rows, width)``.

    Built, checked, by :func:`sparse_parts`; the layers trust it.  Parts
    built by hand are checked completely (one host sync) at their first use,
    eager or in a ``torch.compile``d model (by the forward operators, on the
    real tensors), as a torch sparse tensor is: an invalid pattern would make
    the kernels read out of bounds.  A layer
    that reads a :class:`SparseParts` returns dense tensors
    (:class:`~nnsparse.SparseLinearBatch`) or a :class:`SparseParts` with
    the same pattern (:class:`~nnsparse.SparseOutputLinear`).

    Example::

        >>> parts = nnsparse.sparse_parts(torch.tensor([[0., 2.], [3., 0.]]).to_sparse())
        >>> parts.crow, parts.col, parts.size
        (tensor([0, 1, 2]), tensor([1, 0]), (2, 2))
        >>> doubled = parts.with_values(parts.values * 2)   # same pattern, new values
        >>> doubled.to_sparse_csr().to_dense()
        tensor([[0., 4.],
                [6., 0.]])
        >>> doubled.to("cpu").values
        tensor([4., 6.])
    """

    crow: Tensor
    col: Tensor
    values: Tensor
    size: Tuple[int, int]

    def with_values(self, values: Tensor) -> "SparseParts":
        """The same pattern with other ``values`` (e.g. after an activation).

        Args:
            values (Tensor): dense ``(nnz,)``, on the pattern's device; any dtype,
                autograd link kept.

        Returns:
            SparseParts: ``crow``, ``col`` and ``size`` shared with ``self``.

        Raises:
            TypeError: ``values`` is not a dense tensor.
            ValueError: ``values`` is not ``(nnz,)`` or not on the pattern's device
                (not checked while ``torch.compile`` traces).
        """
        if not isinstance(values, Tensor):
            raise TypeError(f"values must be a Tensor, got {type(values).__name__}")
        if values.layout != torch.strided:
            raise TypeError(f"values must be a dense (nnz,) tensor, got layout {values.layout}")
        if not torch.compiler.is_compiling() and tuple(values.shape) != tuple(self.col.shape):
            raise ValueError(f"values must have shape ({self.col.shape[0]},) (one per entry), "
                             f"got {tuple(values.shape)}")
        if not torch.compiler.is_compiling() and values.device != self.col.device:
            raise ValueError(f"values must be on the pattern's device {self.col.device}, "
                             f"got {values.device}")
        return self._replace(values=values)  # same crow/col: still checked

    def to_sparse_csr(self) -> Tensor:
        """A torch sparse CSR tensor (trusted) for eager code, e.g. a criterion.

        The values keep their autograd link, with an O(nnz) backward.

        Returns:
            Tensor: sparse CSR, shape ``size``, sharing ``crow``, ``col`` and ``values``.

        Raises:
            TypeError, ValueError: parts built by hand that do not form a valid
                pattern (checked once; parts from :func:`sparse_parts` are trusted).
        """
        from .values import _csr_with_values  # values imports the layers' modules
        _check_parts(self, None, "parts")
        return _csr_with_values(self.crow, self.col, self.values, self.size)

    def to(self, device: Any, non_blocking: bool = False) -> "SparseParts":
        """The parts on ``device`` (nnz still marked dynamic).

        Args:
            device (torch.device, str or int): the target device.
            non_blocking (bool): as ``Tensor.to``'s.

        Returns:
            SparseParts: the three tensors moved; checked parts stay trusted.

        Raises:
            TypeError: ``device`` is a dtype (cast ``values`` with :meth:`with_values`)
                or not a device.
            ValueError: an unknown device name, or parts built by hand on the CPU that
                do not form a valid pattern.
        """
        if isinstance(device, torch.dtype):  # as Tensor.to(dtype) would take it
            raise TypeError(f"device must be a torch.device or a name such as 'cpu', got "
                            f"the dtype {device}: SparseParts.to moves the parts; cast the "
                            f"values with parts.with_values(parts.values.to({device}))")
        device = as_device(device)
        out = SparseParts(self.crow.to(device, non_blocking=non_blocking),
                          self.col.to(device, non_blocking=non_blocking),
                          self.values.to(device, non_blocking=non_blocking), self.size)
        if not _is_checked(self) and self.col.device.type == "cpu":
            # parts built or unpickled (a DataLoader worker's) on the CPU: checked there,
            # at no device sync, rather than on the accelerator at their first use
            _check_parts(self, None, "parts")
        if _is_checked(self):
            _mark_checked(out)  # a copy of checked parts
        _mark_dynamic(out)
        return out


@compile_boundary
def sparse_parts(x: Any, *, dynamic: bool = True) -> SparseParts:
    """The :class:`SparseParts` of any accepted sparse batch (COO, CSR, lists, pairs).

    Call it in eager code, outside the compiled function (once per batch, on
    the batch's device): it checks the batch (unless nnsparse built or
    :func:`~nnsparse.trust` vouched for it), sums duplicates and sorts the
    entries by row.  The values keep their autograd link.

    Args:
        x: a 2-D sparse batch in any accepted form, shape ``(rows, width)``.
        dynamic (bool): mark the nnz dimension dynamic
            (``torch._dynamo.maybe_mark_dynamic``), so batches with another
            number of entries reuse the compiled graph.  Default: ``True``.

    Returns:
        A :class:`SparseParts` on ``x``'s device and dtype.

    Raises:
        TypeError, ValueError: as :func:`nnsparse.densify` for a bad batch (values
            of a dtype torch's sparse kernels lack included).
        ValueError: ``x`` is a sparse vector (1-D); give a batch of one row.

    Example::

        >>> x = torch.tensor([[0., 2.], [3., 0.]]).to_sparse()
        >>> nnsparse.sparse_parts(x)
        SparseParts(crow=tensor([0, 1, 2]), col=tensor([1, 0]), values=tensor([2., 3.]),
                    size=(2, 2))
    """
    dynamic = as_flag(dynamic, "dynamic")
    batch = as_sparse_batch(x, name="x", pairs=False)
    check_kernel_dtype(batch.dtype, "x values")
    if batch.is_vector:
        raise ValueError(f"x must be a 2-D sparse batch, got a vector of shape "
                         f"({batch.width},); use x.unsqueeze(0)")
    batch = batch.coalesce()  # distinct positions, row-major: a no-op for CSR and collated COO
    rows, width = batch.shape
    parts = SparseParts(_plain(batch.crow_indices()), _plain(batch.col), _plain(batch.values),
                        (rows, width))
    _mark_checked(parts)  # as_sparse_batch checked it (or it was trusted)
    if dynamic:
        _mark_dynamic(parts)
    return parts


def _mark_dynamic(parts: SparseParts) -> None:
    """nnz is a dynamic dimension: another batch's nnz reuses the compiled graph."""
    for t in (parts.col, parts.values):
        torch._dynamo.maybe_mark_dynamic(t, 0)


def _plain(t: Tensor) -> Tensor:
    """``t`` as a tensor that is not an autograd view (of a sparse tensor's values).

    dynamo fakes a view's base too, and a sparse base is what it cannot take.
    ``detach`` shares the memory; values that require grad are copied (O(nnz))
    to keep their autograd link.
    """
    if not t._is_view():
        return t
    return t.clone() if t.requires_grad else t.detach()


# -- the operators --------------------------------------------------------------


def _float_up(t: Tensor) -> Tensor:
    """float32 for the half types: torch's sampled product has no float16/bfloat16
    kernel, on the CPU nor on CUDA (checked on an H100, torch 2.11)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _large_table_batch(crow: Tensor, col: Tensor, table: Tensor,
                       values: Optional[Tensor] = None,
                       sampled: bool = False) -> Optional[SparseBatch]:
    """The parts as a trusted batch over ``table``'s rows when the products read
    ``table`` in blocks (a large CPU table, :func:`nnsparse._kernels._table_blocks`)
    or, with ``sampled``, when the sampled product reads it in column-major order
    (:func:`nnsparse._kernels._sampled_by_column`): its orders (``blocked_order``,
    ``column_major`` or ``column_major_all``) are what those products read.  Built
    per call, as an operator keeps nothing between calls.  None for a table read in
    one pass, in row-major order.  Without ``values`` the batch's are left unset
    (``empty``): the orders read only the positions."""
    if not (_sampled_by_column(table) if sampled else _table_blocks(table) > 1):
        return None
    if values is None:
        values = table.new_empty(col.shape[0])
    batch = SparseBatch(_index.rows_from_crow(crow, col.shape[0]), col, values,
                        (crow.shape[0] - 1, table.shape[0]), "csr", row_sorted=True,
                        coalesced=True, trusted=True)
    batch.cache.crow = crow
    return batch


@torch.library.custom_op("nnsparse::sparse_mm", mutates_args=())
def _sparse_mm(crow: Tensor, col: Tensor, values: Tensor, table: Tensor,
               bias: Optional[Tensor], check: bool = False) -> Tensor:
    if check:  # the forward path's call: parts that reached it unchecked, under the compiler
        _check_pattern_of(crow, col, values, (crow.shape[0] - 1, table.shape[0]), "input")
    table = table.contiguous()
    out = _table_mm(_large_table_batch(crow, col, table, values), col, table, crow, values)
    if bias is not None:
        out = out + bias
    return out


@_sparse_mm.register_fake
def _(crow: Tensor, col: Tensor, values: Tensor, table: Tensor, bias: Optional[Tensor],
      check: bool = False) -> Tensor:
    return table.new_empty(crow.shape[0] - 1, table.shape[1])


@torch.library.custom_op("nnsparse::sampled_mm", mutates_args=())
def _sampled(h: Tensor, table: Tensor, bias: Optional[Tensor], crow: Tensor,
             col: Tensor, check: bool = False) -> Tensor:
    if check:  # as _sparse_mm's; the pattern's values are not read: h stands in for them
        _check_pattern_of(crow, col, col, (crow.shape[0] - 1, table.shape[0]), "pattern")
    dtype = h.dtype
    h, table = _float_up(h).contiguous(), _float_up(table).contiguous()
    out = _sampled_rows(_large_table_batch(crow, col, table, sampled=True), h, table, crow,
                        col)
    if bias is not None:
        out = out + bias[col]
    return out.to(dtype)


@_sampled.register_fake
def _(h: Tensor, table: Tensor, bias: Optional[Tensor], crow: Tensor, col: Tensor,
      check: bool = False) -> Tensor:
    return h.new_empty(col.shape[0])


@torch.library.custom_op("nnsparse::sparse_t_mm", mutates_args=())
def _sparse_t_mm(crow: Tensor, col: Tensor, values: Tensor, dense: Tensor, n: int) -> Tensor:
    return _t_mm(_index.rows_from_crow(crow, col.shape[0]), col, values, dense.contiguous(), n)


@_sparse_t_mm.register_fake
def _(crow: Tensor, col: Tensor, values: Tensor, dense: Tensor, n: int) -> Tensor:
    return dense.new_empty(n, dense.shape[1])


# -- autograd -------------------------------------------------------------------


def _setup_sparse_mm(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    crow, col, values, table, bias, _ = inputs
    ctx.save_for_backward(crow, col, values, table)
    ctx.has_bias = bias is not None


def _backward_sparse_mm(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    crow, col, values, table = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_values = grad_table = grad_bias = None
    if need[2]:  # only at the specified entries: (G @ table.T)[row, col]
        grad_values = _sampled(grad, table, None, crow, col)
    if need[3]:
        grad_table = _sparse_t_mm(crow, col, values, grad, table.shape[0])
    if ctx.has_bias and need[4]:
        grad_bias = grad.sum(0)
    return None, None, grad_values, grad_table, grad_bias, None


def _setup_sampled(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    h, table, bias, crow, col, _ = inputs
    ctx.save_for_backward(h, table, crow, col)
    ctx.has_bias = bias is not None


def _backward_sampled(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    h, table, crow, col = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_h = grad_table = grad_bias = None
    if need[0]:  # S @ table, S the (rows, out) CSR of the incoming gradient
        grad_h = _sparse_mm(crow, col, grad, table, None)
    if need[1]:  # S.T @ h
        grad_table = _sparse_t_mm(crow, col, grad, h, table.shape[0])
    if ctx.has_bias and need[2]:
        grad_bias = grad.new_zeros(table.shape[0]).index_add(0, col, grad)
    return grad_h, grad_table, grad_bias, None, None, None


def _setup_sparse_t_mm(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    crow, col, values, dense, n = inputs
    ctx.save_for_backward(crow, col, values, dense)


def _backward_sparse_t_mm(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    # out = S.T @ D: d values = (D @ grad.T)[row, col] sampled, d D = S @ grad.
    crow, col, values, dense = ctx.saved_tensors
    need = ctx.needs_input_grad
    grad_values = grad_dense = None
    if need[2]:
        grad_values = _sampled(dense, grad, None, crow, col)
    if need[3]:
        grad_dense = _sparse_mm(crow, col, values, grad, None)
    return None, None, grad_values, grad_dense, None


_sparse_mm.register_autograd(_backward_sparse_mm, setup_context=_setup_sparse_mm)
_sampled.register_autograd(_backward_sampled, setup_context=_setup_sampled)
_sparse_t_mm.register_autograd(_backward_sparse_t_mm, setup_context=_setup_sparse_t_mm)

# Under autocast the sparse products compute in float32 (float64 stays), as
# torch's own embedding_bag and sparse kernels: a bfloat16 sum over a row's
# hundreds of ratings loses the precision the criteria need.
for _op in (_sparse_mm, _sampled, _sparse_t_mm):
    for _device in ("cpu", "cuda"):
        torch.library.register_autocast(_op, _device, torch.float32)


# -- what the layers call ----------------------------------------------------------


def _check_parts(parts: SparseParts, width: Optional[int], name: str) -> None:
    """Shape-only checks (no host sync: free under the compiler, trusted parts);
    ``width``: the one the reader needs, None for any."""
    if not torch.compiler.is_compiling():
        for field in ("crow", "col", "values"):
            value = getattr(parts, field)
            if not isinstance(value, Tensor):
                raise TypeError(f"{name}.{field} must be a Tensor, got {type(value).__name__}")
            if value.layout != torch.strided:
                raise TypeError(f"{name}.{field} must be a dense tensor, got layout "
                                f"{value.layout}")
            if value.dim() != 1:
                raise ValueError(f"{name}.{field} must be 1-D, got shape {tuple(value.shape)}")
        for field in ("crow", "col"):
            dtype = getattr(parts, field).dtype
            if dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}.{field} must be an int64 or int32 tensor, got {dtype}")
        devices = {getattr(parts, f).device for f in ("crow", "col", "values")}
        if len(devices) > 1:
            raise ValueError(f"{name}.crow, .col and .values must be on one device, got "
                             f"{sorted(str(d) for d in devices)}")
        size = parts.size
        if not isinstance(size, (tuple, list, torch.Size)) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in size):
            raise TypeError(f"{name}.size must be (rows, width), two non-negative ints, "
                            f"got {size!r}")
        if len(size) != 2 or any(n < 0 for n in size):
            raise ValueError(f"{name}.size must be (rows, width), two non-negative ints, "
                             f"got {size!r}")
        if parts.values.shape[0] != parts.col.shape[0]:
            raise ValueError(f"{name}.values must hold one value per column index, got "
                             f"{parts.values.shape[0]} values for {parts.col.shape[0]}")
        if width is not None and parts.size[1] != width:
            raise ValueError(f"{name} must have width {width}, got size {tuple(parts.size)}")
        if parts.crow.shape[0] != parts.size[0] + 1:
            raise ValueError(f"{name} crow must have rows + 1 = {parts.size[0] + 1} entries, "
                             f"got {parts.crow.shape[0]}")
        _check_pattern(parts, name)


# The attribute on ``parts.col`` that records a complete check of the parts' pattern
_CHECKED_ATTR = "_nnsparse_parts_checked"


def _checked_key(parts: SparseParts) -> Optional[Tuple[Any, ...]]:
    """What must not change for a checked pattern to stay valid (free to read); None
    where the index tensors have no storage (a ``torch.func`` transform)."""
    crow_ptr, col_ptr = _index.data_ptr(parts.crow), _index.data_ptr(parts.col)
    if crow_ptr is None or col_ptr is None:
        return None
    # (an inference tensor has no version counter: -1, its in-place edits unseen, as for
    # the structures _forms caches)
    return (crow_ptr, col_ptr, _version(parts.crow), _version(parts.col),
            tuple(parts.crow.shape), tuple(parts.col.shape), tuple(parts.size))


def _is_checked(parts: SparseParts) -> bool:
    key = _checked_key(parts)
    return key is not None and getattr(parts.col, _CHECKED_ATTR, None) == key


def _mark_checked(parts: SparseParts) -> None:
    key = _checked_key(parts)
    if key is not None:
        setattr(parts.col, _CHECKED_ATTR, key)


def _check_pattern(parts: SparseParts, name: str) -> None:
    """Every CSR invariant of parts built by hand (the kernels index with them
    unchecked: out-of-range pointers read and write out of bounds), once: parts
    from :func:`sparse_parts`, ``with_values`` and ``to`` are marked checked."""
    _check_pattern_of(parts.crow, parts.col, parts.values, parts.size, name)


def _check_pattern_of(crow: Tensor, col: Tensor, values: Tensor, size: Tuple[int, int],
                      name: str) -> None:
    """:func:`_check_pattern` of the parts' tensors.  The forward operators call it too
    (``check=True``), with real tensors even in a compiled graph, whose tracing skips
    the layers' checks: there the user's own ``col`` reaches the operator, so parts
    that :func:`sparse_parts` marked cost an attribute read (no host sync), and parts
    built by hand are checked at their first compiled call, as at their first eager
    one.  The backward's calls do not check: the forward checked the same pattern."""
    if col.device.type == "meta":
        return  # no data to read (and no kernel to run)
    parts = SparseParts(crow, col, values, (int(size[0]), int(size[1])))
    if _is_checked(parts):
        return
    _check_csr(crow, col, values, parts.size[0], parts.size[1], name)
    _mark_checked(parts)


def _refuse_in_transform(*tensors: Optional[Tensor]) -> None:
    """The operators cannot run inside a ``torch.func`` transform (whose tensors have no
    storage, :func:`nnsparse._index.data_ptr`): the autograd that
    ``torch.library.register_autograd`` generates has no ``setup_context``, which the
    transforms require (pytorch/pytorch#170834, torch 2.13).  Skipped while compiling,
    where the tensors are fake."""
    if torch.compiler.is_compiling():
        return
    if any(t is not None and _index.data_ptr(t) is None for t in tensors):
        raise NotImplementedError(
            "a SparseParts batch (the torch.compile input path) cannot be used inside a "
            "torch.func transform: torch's custom operators (torch.library.register_autograd) "
            "do not support torch.func transforms; give the layers the torch sparse tensor "
            "itself (the batch, or parts.to_sparse_csr())")


def _check_input(h: Any, weight: Tensor, pattern: SparseParts) -> None:
    """:func:`sampled_parts`' dense input against the weight and the pattern, as the
    eager ``sampled_linear`` checks it (kind, shape, device, dtype); no host sync.
    While compiling, the shapes are not compared (a comparison of a dynamic size would
    specialise the graph on it); kind, device and dtype are, so that eager and compiled
    runs refuse the same mismatches."""
    if not isinstance(h, Tensor) or h.layout != torch.strided:
        raise TypeError(f"input must be a dense tensor, got "
                        f"{h.layout if isinstance(h, Tensor) else type(h).__name__}")
    if not torch.compiler.is_compiling() and (
            h.dim() != 2 or h.shape[0] != pattern.size[0] or h.shape[1] != weight.shape[1]):
        raise ValueError(f"input must have shape ({pattern.size[0]}, {weight.shape[1]}) for "
                         f"pattern of size {tuple(pattern.size)}, got {tuple(h.shape)}")
    if weight.device != h.device:
        raise ValueError(f"weight must be on input's device {h.device}, got {weight.device}")
    if pattern.col.device != h.device:
        raise ValueError(f"pattern must be on input's device {h.device}, got {pattern.col.device}")
    # autocast: the operator computes in float32 whatever the input's floating dtype
    if weight.dtype != h.dtype and not (h.is_floating_point()
                                        and torch.is_autocast_enabled(h.device.type)):
        raise ValueError(f"weight must have input's dtype {h.dtype}, got {weight.dtype}"
                         f"{_operand_dtype_hint('weight', weight.dtype, h.dtype)}")


def _gives_grad(weight: Tensor, bias: Optional[Tensor]) -> bool:
    """The call would give the weight or the bias a gradient (which sparse_grad shapes):
    an inference forward (no_grad, inference_mode, frozen parameters) gives none."""
    return torch.is_grad_enabled() and (
        weight.requires_grad or (bias is not None and bias.requires_grad))


def linear_parts(parts: SparseParts, table: Tensor, bias: Optional[Tensor],
                 mode: str, sparse_grad: bool) -> Tensor:
    """``S @ table + bias`` for a :class:`SparseParts` ``S``: dense ``(rows, out)``."""
    if sparse_grad and _gives_grad(table, bias):
        raise NotImplementedError("sparse_grad=True is not supported with SparseParts input "
                                  "(torch.compile) in training: the compiled path gives dense "
                                  "gradients (under torch.no_grad(), or with the weight and "
                                  "bias frozen, it runs)")
    _check_parts(parts, table.shape[0], "input")
    if not torch.compiler.is_compiling():
        if parts.values.dtype != table.dtype and not torch.is_autocast_enabled(
                parts.values.device.type):  # autocast: the operator computes in float32
            raise ValueError(f"input must have the weight's dtype {table.dtype}, "
                             f"got {parts.values.dtype}"
                             f"{_dtype_hint(parts.values.dtype, table.dtype)}")
        if parts.values.device != table.device:
            raise ValueError(f"input must be on the weight's device {table.device}, "
                             f"got {parts.values.device}")
    if mode == "dense":
        row = _index.rows_from_crow(parts.crow, parts.col.shape[0])
        dense = parts.values.new_zeros(parts.size).index_put((row, parts.col), parts.values,
                                                             accumulate=True)
        return torch.nn.functional.linear(dense, table.t(), bias)
    _refuse_in_transform(parts.values, table, bias)
    # check: the pattern's check, skipped above while compiling, runs in the operator
    return cast(Tensor, _sparse_mm(parts.crow, parts.col, parts.values, table, bias, True))


def sampled_parts(h: Tensor, weight: Tensor, bias: Optional[Tensor], pattern: SparseParts,
                  sparse_grad: bool) -> SparseParts:
    """``h @ weight.T + bias`` at ``pattern``'s entries, as a :class:`SparseParts`."""
    if sparse_grad and _gives_grad(weight, bias):
        raise NotImplementedError("sparse_grad=True is not supported with a SparseParts "
                                  "pattern (torch.compile) in training: the compiled path gives "
                                  "dense gradients (under torch.no_grad(), or with the weight "
                                  "and bias frozen, it runs)")
    _check_parts(pattern, weight.shape[0], "pattern")
    _check_input(h, weight, pattern)
    _refuse_in_transform(h, weight, bias)
    values = _sampled(h, weight, bias, pattern.crow, pattern.col, True)  # check: as linear_parts'
    return pattern.with_values(values)
