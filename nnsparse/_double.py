"""The sparse products with backwards of any order: what the layers' double backward runs.

An eager layer's backward (``_SparseLinear``, ``_SampledLinear``,
``matmul._PatternMM``...) computes its gradients with the fast kernels of
:mod:`nnsparse._kernels` when autograd records nothing (an ordinary
``loss.backward()``).  When it runs with grad mode on (``create_graph=True``,
``torch.autograd.grad`` of a gradient penalty or a Hessian-vector product,
``torch.func.grad``), it computes them with the three products below instead,
whose own backwards are again these products, so every derivative order is
exact.  It is the design of the compile path's custom operators
(:mod:`nnsparse._ops`), as ``torch.autograd.Function`` s, which ``torch.func``
transforms also accept (torch's custom operators they refuse).

For a sparse ``S`` ``(rows, n)`` given as ``values`` at ``(row, col)``,
grouped by row (CSR pointers ``crow``; positions may repeat):

- :func:`mm`: ``S @ table``, ``(rows, d)``, for a dense ``table`` ``(n, d)``;
- :func:`sampled`: ``(h @ table.T)`` at ``S``'s positions, ``(nnz,)``, for
  ``h`` ``(rows, d)``: the gradient of ``values`` in ``mm``;
- :func:`t_mm`: ``S.T @ dense``, ``(n, d)``, for ``dense`` ``(rows, d)``:
  the gradient of ``table`` in ``mm``.

Each is the others' gradient: ``d mm = (sampled, t_mm)``, ``d sampled =
(mm, t_mm)``, ``d t_mm = (sampled, mm)``.  ``pattern`` (the batch of these
positions, or None) lends its cached structures (``column_major_all``,
``blocked_order``); without it they are built per call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple, cast

import torch
from torch import Tensor

from . import _index
from ._kernels import _sampled_rows, _t_mm, _table_mm

if TYPE_CHECKING:
    from ._forms import SparseBatch

__all__: List[str] = []


def _rows_of(row: Optional[Tensor], crow: Tensor, col: Tensor) -> Tensor:
    return row if row is not None else _index.rows_from_crow(crow, col.shape[0])


class _TableProduct(torch.autograd.Function):
    """What :class:`_MM` and :class:`_Sampled` share: inputs ``(operand, table, row,
    col, crow, pattern, sparse_grad)``, saved alike; each has its own products."""

    # jacrev/vmap over a backward that calls it: vmap runs forward on batched tensors
    generate_vmap_rule = True

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        operand, table, row, col, crow, pattern, sparse_grad = inputs
        ctx.save_for_backward(operand, table, row, col, crow)
        ctx.pattern, ctx.sparse_grad = pattern, sparse_grad


class _MM(_TableProduct):
    """``S @ table``; see the module docstring."""

    @staticmethod
    def forward(values: Tensor, table: Tensor, row: Tensor, col: Tensor, crow: Tensor,
                pattern: Optional["SparseBatch"], sparse_grad: bool) -> Tensor:
        if col.shape[0] == 0 or table.shape[1] == 0:  # (embedding_bag takes neither)
            return table.new_zeros(crow.shape[0] - 1, table.shape[1])
        return _table_mm(pattern, col, table.contiguous(), crow, values)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        values, table, row, col, crow = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_values = grad_table = None
        if need[0]:  # (G @ table.T) at the specified entries only
            grad_values = sampled(grad, table, row, col, crow, ctx.pattern)
        if need[1]:
            grad_table = _table_grad(values, grad, row, col, crow, table.shape[0], ctx)
        return grad_values, grad_table, None, None, None, None, None


class _Sampled(_TableProduct):
    """``(h @ table.T)[row, col]``; see the module docstring."""

    @staticmethod
    def forward(h: Tensor, table: Tensor, row: Tensor, col: Tensor, crow: Tensor,
                pattern: Optional["SparseBatch"], sparse_grad: bool) -> Tensor:
        return _sampled_rows(pattern, h.contiguous(), table.contiguous(), crow, col)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        h, table, row, col, crow = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_h = grad_table = None
        if need[0]:  # S @ table, S the incoming gradient at the positions
            grad_h = mm(grad, table, row, col, crow, ctx.pattern)
        if need[1]:  # S.T @ h
            grad_table = _table_grad(grad, h, row, col, crow, table.shape[0], ctx)
        return grad_h, grad_table, None, None, None, None, None


class _TMM(torch.autograd.Function):
    """``S.T @ dense`` over ``width`` columns; see the module docstring."""

    # jacrev/vmap over a backward that calls it: vmap runs forward on batched tensors
    generate_vmap_rule = True

    @staticmethod
    def forward(values: Tensor, dense: Tensor, row: Tensor, col: Tensor, crow: Tensor,
                width: int, pattern: Optional["SparseBatch"]) -> Tensor:
        if col.shape[0] == 0 or dense.shape[1] == 0:  # (embedding_bag takes neither)
            return dense.new_zeros(width, dense.shape[1])
        return _t_mm(row, col, values, dense.contiguous(), width, pattern)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        values, dense, row, col, crow, width, pattern = inputs
        ctx.save_for_backward(values, dense, row, col, crow)
        ctx.pattern = pattern

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        # out[c] = sum over entries e of column c of values[e] * dense[row[e]]
        values, dense, row, col, crow = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_values = grad_dense = None
        if need[0]:  # dense[row[e]] . grad[col[e]]
            grad_values = sampled(dense, grad, row, col, crow, ctx.pattern)
        if need[1]:  # S @ grad
            grad_dense = mm(values, grad, row, col, crow, ctx.pattern)
        return grad_values, grad_dense, None, None, None, None, None


def _table_grad(values: Tensor, dense: Tensor, row: Tensor, col: Tensor, crow: Tensor,
                width: int, ctx: Any) -> Tensor:
    """``S.T @ dense``, the table's gradient in :class:`_MM` and :class:`_Sampled` and in
    the layers' recorded backwards (``ctx`` holds ``sparse_grad`` and ``pattern``):
    sparse over the touched rows for a ``sparse_grad`` layer's table."""
    if ctx.sparse_grad:
        return touched_t_mm(values, dense, ctx.pattern, width)
    return t_mm(values, dense, row, col, crow, width, ctx.pattern)


def mm(values: Tensor, table: Tensor, row: Optional[Tensor], col: Tensor, crow: Tensor,
       pattern: Optional["SparseBatch"] = None, sparse_grad: bool = False) -> Tensor:
    """``S @ table`` ``(rows, d)``, differentiable to any order in ``values`` and ``table``.

    ``row`` may be None (derived from ``crow``).  ``sparse_grad``: ``table``'s gradient
    is a hybrid COO tensor over the rows ``S`` touches (``pattern`` needed), as a
    ``sparse_grad`` layer's weight gets.
    """
    return cast(Tensor, _MM.apply(  # type: ignore[no-untyped-call]
        values, table, _rows_of(row, crow, col), col, crow, pattern, sparse_grad))


def sampled(h: Tensor, table: Tensor, row: Optional[Tensor], col: Tensor, crow: Tensor,
            pattern: Optional["SparseBatch"] = None, sparse_grad: bool = False) -> Tensor:
    """``(h @ table.T)`` at ``S``'s positions ``(nnz,)``, differentiable to any order
    (``sparse_grad``: as in :func:`mm`)."""
    return cast(Tensor, _Sampled.apply(  # type: ignore[no-untyped-call]
        h, table, _rows_of(row, crow, col), col, crow, pattern, sparse_grad))


def t_mm(values: Tensor, dense: Tensor, row: Optional[Tensor], col: Tensor, crow: Tensor,
         width: int, pattern: Optional["SparseBatch"] = None) -> Tensor:
    """``S.T @ dense`` ``(width, d)``, differentiable to any order in ``values`` and ``dense``."""
    return cast(Tensor, _TMM.apply(  # type: ignore[no-untyped-call]
        values, dense, _rows_of(row, crow, col), col, crow, width, pattern))


def touched_t_mm(values: Tensor, dense: Tensor, pattern: "SparseBatch",
                 width: int) -> Tensor:
    """``S.T @ dense`` restricted to the columns ``S`` touches, as a coalesced hybrid COO
    tensor of shape ``(width, d)`` (``nn.Embedding(sparse=True)``'s gradient form),
    differentiable to any order: its values are :func:`mm` of ``S``'s transposed
    pattern over the touched columns (``pattern.column_major``, cached)."""
    perm, cols, crow_t, row_t = pattern.column_major()
    touched = mm(values.index_select(0, perm), dense, None, row_t, crow_t)
    return _index.coo_tensor(cols.unsqueeze(0), touched, (width, dense.shape[1]), True)
