"""``sparse_mm``: sparse @ dense and dense @ sparse with gradients on the pattern.

A sparse matrix ``A`` (COO or CSR, 2-D ``(n, m)`` or batched 3-D
``(b, n, m)``) times a dense ``B``.  ``A``'s gradient is computed at its
specified entries only, ``(G @ B.T)[i, j]`` for each specified ``(i, j)``,
never as a dense ``(n, m)`` matrix, and arrives in ``A``'s layout on ``A``'s
pattern; ``B``'s gradient is dense.  Each is computed only when autograd asks.

A batch is not block-diagonalised into a sparse ``(b n, b m)`` tensor: its
entries are offset into one flat 2-D pattern (row ``k n + i``, column
``k m + j``) held as index tensors, and ``B`` is viewed as ``(b m, p)``;
the products are then the 2-D ones, see ``benchmarks/bench_sparse_mm.py``.

The products are the project's kernels (:mod:`nnsparse._kernels`):
``embedding_bag`` sums for ``A @ B`` and ``A.T @ G``, ``sampled_addmm`` for
the values' gradient (a chunked gather-and-dot for float16/bfloat16, which
``sampled_addmm`` lacks).

A torch sparse operand is checked once, at its first use, and carries its
structure afterwards (2-D: nnsparse's batch structure, :mod:`nnsparse._forms`;
3-D: the flat pattern below); the transposed structure ``B``'s gradient
needs is built lazily, at most once per pattern.  A step on a checked
operand makes no host synchronisation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, cast

import torch
from torch import Tensor

from . import _double, _index
from ._forms import (_attach_built, _cached, _check_csr, _key, _reusable_after_inference,
                     as_sparse_batch, check_coo_indices, compile_boundary, is_pair_list,
                     is_sparse_form, refuse_meta, scipy_sparse_hint)
from ._kernels import _csr_rows_mm, _gather_dot, _sampled_mm

__all__ = ["sparse_mm"]

# sampled_addmm has float32/float64 (and complex) kernels only; other dtypes
# take the gather-and-dot fallback (chunked, _kernels._gather_dot).
_SAMPLED_DTYPES = (torch.float32, torch.float64)


# The transposed (column-major) structure of a pattern over all its columns:
# ``perm`` (entries in column order), CSR pointers ``(cols + 1,)``, the row of
# each entry in ``perm`` order.
_Transposed = Tuple[Tensor, Tensor, Tensor]


@dataclass
class _Pattern:
    """A row-sorted flat 2-D pattern: what one product runs on.

    ``values`` carries the autograd link to the caller's values; ``row``,
    ``col`` (int64) and ``crow`` (CSR pointers over ``rows``) are plain index
    tensors.  ``transposed`` gives the :data:`_Transposed` structure on demand
    (built at most once per pattern where the caller caches it), ``None``
    when it is to be built in backward.
    """

    values: Tensor
    row: Tensor
    col: Tensor
    crow: Tensor
    rows: int
    cols: int
    transposed: Optional[Callable[[], _Transposed]] = None


def _transposed(row: Tensor, col: Tensor, cols: int) -> _Transposed:
    """``perm``, CSR pointers over all ``cols`` and rows of the transposed pattern.

    Unlike ``SparseBatch.column_major`` (distinct columns only, a
    data-dependent size) every column gets a pointer, so ``S.T @ G`` is one
    product with no scatter and no host sync.
    """
    return _index.column_major_all(row, col, cols)


def _inverse(perm: Tensor) -> Tensor:
    return torch.empty_like(perm).index_put_((perm,), torch.arange(perm.shape[0],
                                                                   device=perm.device))


def _sampled(a: Tensor, b_t: Tensor, crow: Tensor, row: Optional[Tensor], col: Tensor) -> Tensor:
    """``(a @ b_t.T)[row, col]``, shape ``(nnz,)``: the values' gradient.

    ``row`` is read by the gather fallback only (``None`` for float32/float64).
    """
    if a.dtype in _SAMPLED_DTYPES:
        return _sampled_mm(a, b_t.t(), crow, col)
    assert row is not None, "the gather fallback reads row"
    return _gather_dot(a, b_t, row, col)


def _rows_mm(index: Tensor, table: Tensor, crow: Tensor, weights: Tensor) -> Tensor:
    """:func:`_csr_rows_mm`, also for the sizes ``embedding_bag`` refuses (no entry, ``p = 0``)."""
    if index.shape[0] == 0 or table.shape[1] == 0:
        return table.new_zeros(crow.shape[0] - 1, table.shape[1])
    return _csr_rows_mm(index, table, crow, weights)


class _PatternMM(torch.autograd.Function):
    """``S @ B`` for a row-sorted pattern ``S`` with ``values``; dense contiguous ``B``
    ``(cols, p)`` (the caller's copy when its operand is not: saved for the backward,
    so that an in-place change of the caller's tensor after the forward is no error).

    ``row`` may be ``None`` (derived from ``crow`` when a gradient needs it);
    ``transposed`` (a callable giving the :data:`_Transposed` structure, kept
    on ``ctx``) too: the structure is then built in backward when ``B``'s
    gradient needs it.
    """

    # forward and setup_context apart: the form torch.func's transforms require
    @staticmethod
    def forward(values: Tensor, b: Tensor, row: Optional[Tensor], col: Tensor,
                crow: Tensor, transposed: Optional[Callable[[], _Transposed]]) -> Tensor:
        return _rows_mm(col, b, crow, values)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        values, b, row, col, crow, transposed = inputs
        ctx.save_for_backward(values, b, row, col, crow)
        ctx.transposed = transposed

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        values, b, row, col, crow = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True (or torch.func): products whose own backward is exact
            need = ctx.needs_input_grad
            return (_double.sampled(grad, b, row, col, crow) if need[0] else None,
                    _double.t_mm(values, grad, row, col, crow, b.shape[0]) if need[1] else None,
                    None, None, None, None)
        grad = grad.contiguous()
        grad_values = grad_b = None
        if row is None and ((ctx.needs_input_grad[0] and values.dtype not in _SAMPLED_DTYPES) or
                            (ctx.needs_input_grad[1] and ctx.transposed is None)):
            # only the gather fallback and the transposed structure read rows
            row = _index.rows_from_crow(crow, col.shape[0])
        if ctx.needs_input_grad[0]:
            # (G @ B.T) at the specified entries only: O(nnz p), never (rows, cols).
            grad_values = _sampled(grad, b, crow, row, col)
        if ctx.needs_input_grad[1]:
            if ctx.transposed is not None:
                t_perm, t_crow, t_row = ctx.transposed()
            else:
                t_perm, t_crow, t_row = _transposed(row, col, b.shape[0])
            # S.T @ G: one bag per column of S (empty bags give B's zero rows).
            grad_b = _rows_mm(t_row, grad, t_crow, values[t_perm])
        return grad_values, grad_b, None, None, None, None


def _pattern_mm(p: _Pattern, b: Tensor) -> Tensor:
    """``S @ b`` (``(rows, p)``) on a flat pattern, with pattern gradients."""
    return cast(Tensor, _PatternMM.apply(  # type: ignore[no-untyped-call]
        p.values, b.contiguous(), p.row, p.col, p.crow, p.transposed))


# -- the flat pattern of an operand, checked once and cached on the tensor ----------

# Where a 3-D torch tensor carries its checked flat structure (2-D tensors
# carry nnsparse's batch structure, see nnsparse._forms).
_ATTR = "_nnsparse_flat_structure"


@dataclass(eq=False)
class _Flat:
    """The checked index structure of a 3-D tensor's flat ``(b n, b m)`` pattern.

    ``order`` puts the tensor's stored entries in row order (an uncoalesced
    COO that needs no gradient), ``recoalesce`` says its values are read from
    ``coalesce()`` (one that needs a gradient); the values are always read
    from the tensor at each call.
    """

    key: Optional[Tuple[Any, ...]]
    row: Tensor
    col: Tensor
    crow: Tensor
    rows: int
    cols: int
    order: Optional[Tensor] = None
    recoalesce: bool = False
    _transposed: Optional[_Transposed] = None
    # used under torch.inference_mode(): what was built there may be inference tensors
    # (the rule of a batch's cache, nnsparse._forms._Cache.inference)
    inference: bool = False

    def holds_inference(self) -> bool:
        """Whether an index tensor was made under ``torch.inference_mode()`` (built there,
        or the tensor was made there): autograd cannot save it for a backward."""
        tensors = (self.row, self.col, self.crow, self.order, *(self._transposed or ()))
        return any(t is not None and t.is_inference() for t in tensors)

    def transposed(self) -> _Transposed:
        if self._transposed is None:
            self._transposed = _transposed(self.row, self.col, self.cols)
        return self._transposed

    def values_of(self, a: Tensor) -> Tensor:
        if a.layout == torch.sparse_csr:
            return _index.csr_values(a).reshape(-1)
        if self.recoalesce:
            return a.coalesce().values()
        values = a.values() if (a.requires_grad and a.is_coalesced()) else a._values()
        return values if self.order is None else values[self.order]


def _check_hybrid(a: Tensor, name: str) -> None:
    dense = _index.csr_read(a.dense_dim)  # (a CSR tensor's too inside torch.func transforms)
    if dense != 0 or (a.layout == torch.sparse_coo and a.sparse_dim() != 3):
        sparse = a.sparse_dim() if a.layout == torch.sparse_coo else 3 - dense
        raise NotImplementedError(f"{name}: hybrid sparse tensors are not supported, got "
                                  f"sparse_dim {sparse}, dense_dim {dense}")


def _flat_coo(a: Tensor, name: str) -> _Flat:
    _index.count("validate")
    nb, n, m = a.shape
    recoalesce = a.requires_grad and not a.is_coalesced()
    source = a.coalesce() if recoalesce else a  # differentiable values need coalesced
    k, i, j = source._indices()
    # only the caller's claim to be coalesced is checked (a tensor coalesced here, by
    # torch, holds it)
    check_coo_indices(source._indices(), a.shape, name,
                      ("batch indices", "row indices", "column indices"), a.is_coalesced())
    row, col, order = k * n + i, k * m + j, None
    if not source.is_coalesced():  # coalesced: sorted by (k, i, j), hence by k n + i
        order = _index.stable_order(row, nb * n)
        row, col = row.index_select(0, order), col.index_select(0, order)
    return _Flat(_key(a), row, col, _index.crow_from_rows(row, nb * n), nb * n, nb * m,
                 order, recoalesce)


def _flat_csr(a: Tensor, name: str) -> _Flat:
    _index.count("validate")
    nb, n, m = a.shape
    crow, col = (t.to(torch.int64) for t in _index.csr_indices(a))
    per = col.shape[1]  # batched CSR: every matrix holds the same nnz
    if crow.shape[1] != n + 1:
        raise ValueError(f"{name} crow_indices must have rows + 1 = {n + 1} entries per "
                         f"matrix, got {crow.shape[1]}")
    if nb == 0:
        return _Flat(_key(a), crow.new_zeros(0), crow.new_zeros(0), crow.new_zeros(1), 0, 0)
    first, last = crow[:, 0], crow[:, -1]
    # the per-matrix pointer ends first: the flat pointers below assume them
    lo, hi, end_lo, end_hi = torch.stack([first.min(), first.max(), last.min(),
                                          last.max()]).tolist()
    if lo != 0 or hi != 0:
        raise ValueError(f"{name} crow_indices must start at 0 in every matrix, got "
                         f"{lo if lo != 0 else hi}")
    if end_lo != per or end_hi != per:
        raise ValueError(f"{name} crow_indices must end at nnz = {per} (the column indices "
                         f"per matrix) in every matrix, got {end_lo if end_lo != per else end_hi}")
    offsets = torch.arange(nb, device=crow.device).unsqueeze(1)
    flat_crow = torch.cat([(crow[:, :-1] + offsets * per).reshape(-1),
                           crow.new_full((1,), nb * per)])
    # the flat pattern is one 2-D CSR matrix: the 2-D checks (steps, column
    # range, increasing columns) apply unchanged, with each matrix's bound m
    _check_csr(flat_crow, col.reshape(-1), _index.csr_values(a).reshape(-1), nb * n, m, name)
    row = _index.rows_from_crow(flat_crow, nb * per)
    return _Flat(_key(a), row, (col + offsets * m).reshape(-1), flat_crow, nb * n, nb * m)


def _flat_pattern_3d(a: Tensor, name: str) -> _Pattern:
    """The flat ``(b n, b m)`` pattern of a batched 3-D COO or CSR tensor.

    Entry ``(k, i, j)`` goes to row ``k n + i``, column ``k m + j``: the
    block-diagonal matrix's pattern, as index tensors, without building it.
    Checked and built at the tensor's first use, then cached on it.
    """
    if a.layout not in (torch.sparse_coo, torch.sparse_csr):
        raise NotImplementedError(f"{name}: layout {a.layout} is not supported; convert with "
                                  ".to_sparse_coo() or .to_sparse_csr()")
    _check_hybrid(a, name)
    flat = _cached(a, _ATTR, _Flat)
    if flat is not None and not _reusable_after_inference(flat, flat.holds_inference):
        flat = None  # it holds an inference tensor, now used outside inference mode
    if flat is None:  # (not cached where its key is None: inside a transform)
        build = _flat_coo if a.layout == torch.sparse_coo else _flat_csr
        flat = _attach_built(a, lambda source: build(source, name), _ATTR)
    if torch.is_inference_mode_enabled():
        flat.inference = True  # a new one too: what it builds later may be inference tensors
    # (an inference tensor's values are copied for autograd, as its structure is)
    return _Pattern(_index.outside_inference(flat.values_of(a)), flat.row, flat.col, flat.crow,
                    flat.rows, flat.cols, flat.transposed)


def _pattern_2d(a: Any, name: str, width: Optional[int] = None
                ) -> Tuple[_Pattern, Tuple[int, int]]:
    batch = as_sparse_batch(a, name=name, pairs=False, width=width)
    if batch.is_vector:
        raise ValueError(f"{name} must be a 2-D or 3-D sparse matrix, got a sparse vector")
    # the batch caches its row order, row pointers and column-major order per
    # pattern: a tensor multiplied again (or by another nnsparse layer) reuses them
    batch = batch.sorted_by_row()
    structure = batch.with_pattern_values(batch.values.detach()[:0])  # no values held

    def transposed() -> _Transposed:
        return structure.column_major_all(structure.width)
    p = _Pattern(batch.values, batch.row, batch.col, batch.crow_indices(), batch.rows,
                 batch.width, transposed)
    return p, batch.shape


def _transpose_pattern(p: _Pattern) -> _Pattern:
    """The pattern of ``S.T`` (row-sorted; values gathered differentiably).

    Its own transposed structure is ``S``'s row-major one: the inverse of
    ``perm``, ``S``'s row pointers and columns.
    """
    perm, crow_t, row_t = (p.transposed() if p.transposed is not None
                           else _transposed(p.row, p.col, p.cols))
    row_of_t = _index.rows_from_crow(crow_t, perm.shape[0])
    return _Pattern(p.values[perm], row_of_t, row_t, crow_t, p.cols, p.rows,
                    lambda: (_inverse(perm), p.crow, p.col))


def _check_dense(b: Any, name: str, dims: int, dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(b, Tensor):
        raise TypeError(f"{name} must be a dense torch.Tensor, got {type(b).__name__}")
    if b.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D like the sparse operand, got shape "
                         f"{tuple(b.shape)}")
    if not b.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {b.dtype}")
    if b.dtype != dtype:
        raise ValueError(f"{name} must have the sparse operand's dtype {dtype}, got {b.dtype}")
    if b.device != device:
        raise ValueError(f"{name} must be on the sparse operand's device {device}, got {b.device}")


def _holds_no_tensor(x: Any) -> bool:
    """A non-empty list/tuple of plain numbers (or lists): beside a sparse operand, a
    (wrong) dense operand rather than a second sparse one."""
    return isinstance(x, (list, tuple)) and bool(x) and not any(isinstance(r, Tensor) for r in x)


def _sparse_operand(a: Any, name: str, width: Optional[int] = None
                    ) -> Tuple[_Pattern, Tuple[int, ...]]:
    """The flat pattern of ``a`` and its shape ``(n, m)`` or ``(b, n, m)``; ``width`` the
    columns of a list of Lua pair rows, which tell none."""
    if isinstance(a, (list, tuple)) and not a:
        raise ValueError(f"{name} is an empty list of sparse rows, which has no width; pass a "
                         f"torch sparse tensor of shape (0, m)")
    if isinstance(a, Tensor):
        refuse_meta(a, name)  # before any index is read
    if isinstance(a, Tensor) and a.layout != torch.strided:
        if a.dim() == 3:
            return _flat_pattern_3d(a, name), tuple(a.shape)
        if a.dim() != 2:
            raise ValueError(f"{name} must be a 2-D or 3-D sparse matrix, got shape "
                             f"{tuple(a.shape)}")
    p, shape = _pattern_2d(a, name, width)
    return p, shape


def _checked_operand(a: Any, name: str, width: Optional[int] = None
                     ) -> Tuple[_Pattern, Tuple[int, ...]]:
    p, shape = _sparse_operand(a, name, width)
    if not p.values.is_floating_point():
        raise TypeError(f"{name} must be a floating-point sparse matrix, got {p.values.dtype}")
    return p, shape


def _sparse_dense(a: Any, b: Any) -> Tensor:
    # pair rows are as wide as B is tall (their largest index + 1 was refused as too narrow)
    width = b.shape[-2] if is_pair_list(a) and isinstance(b, Tensor) and b.dim() == 2 else None
    p, shape = _checked_operand(a, "A", width)
    _check_dense(b, "B", len(shape), p.values.dtype, p.values.device)
    if len(shape) == 3 and b.shape[0] != shape[0]:
        raise ValueError(f"A and B must have the same batch size, got {shape[0]} and {b.shape[0]}")
    if shape[-1] != b.shape[-2]:
        raise ValueError(f"Incompatible inner dimensions: A[..., {shape[-1]}] vs "
                         f"B[{b.shape[-2]}, ...]")
    out = _pattern_mm(p, b.reshape(p.cols, b.shape[-1]))
    return out.view(*shape[:-1], b.shape[-1])


def _dense_sparse(a: Tensor, b: Any) -> Tensor:
    """``a @ S`` as ``(S.T @ a.T).T``: the transposed pattern times ``a``'s columns."""
    p, shape = _checked_operand(b, "B")
    _check_dense(a, "A", len(shape), p.values.dtype, p.values.device)
    if len(shape) == 3 and a.shape[0] != shape[0]:
        raise ValueError(f"A and B must have the same batch size, got {a.shape[0]} and {shape[0]}")
    if a.shape[-1] != shape[-2]:
        raise ValueError(f"Incompatible inner dimensions: A[..., {a.shape[-1]}] vs "
                         f"B[{shape[-2]}, ...]")
    n = a.shape[-2]
    a_t = a.transpose(-1, -2).reshape(p.rows, n)  # (b m, n): a's columns as rows
    out_t = _pattern_mm(_transpose_pattern(p), a_t)  # (b p, n)
    return out_t.view(*shape[:-2], shape[-1], n).transpose(-1, -2).contiguous()


@compile_boundary
def sparse_mm(A: Any, B: Any) -> Tensor:
    r"""Sparse @ dense or dense @ sparse, with the sparse gradient on the pattern.

    Exactly one operand is sparse; the product is dense.  ``sparse_mm(A, B)``
    with ``A`` sparse and ``B`` dense is ``A @ B``; with ``A`` dense and ``B``
    sparse it is ``A @ B`` too (dense on the left).

    Args:
        A: the left operand.  Sparse: a torch COO (coalesced or not) or CSR
            tensor of shape ``(n, m)`` or batched ``(b, n, m)`` (batched CSR:
            the same nnz in every matrix, as torch requires), or a 2-D batch
            in any form :func:`nnsparse._forms.as_sparse_batch` accepts (a list
            of sparse rows...).  Dense: a strided floating tensor ``(n, m)``
            or ``(b, n, m)``.
        B: the right operand, ``(m, p)`` or ``(b, m, p)``; dense when ``A``
            is sparse, sparse (as above) when ``A`` is dense.

    Gradients: the sparse operand's gradient holds its specified entries
    only, ``(G @ B.T)`` (resp. ``A.T @ G``) read at its pattern, with its
    layout: a COO leaf gets a COO gradient on its indices (coalesced ones
    when it was not coalesced: duplicates share a gradient), a CSR leaf a
    CSR gradient on its ``crow``/``col``, a tensor built from a values
    tensor passes them on to it.  Unspecified entries get nothing, as in
    ``torch.sparse.mm``'s masked semantics.  The dense operand's gradient
    is dense.  Each is computed only when it is required, and is
    differentiable again (``create_graph=True``; ``docs/ecosystem.md``).

    A torch sparse operand is checked at its first use (one host
    synchronisation) and remembers its checked structure: a sparse parameter
    multiplied every step is checked and transposed once.

    Returns:
        A dense tensor ``(n, p)`` or ``(b, n, p)``, in the operands' dtype and on
        their device.

    Raises:
        TypeError: neither or both operands are sparse (both:
            ``NotImplementedError``), a dense operand is not a tensor or not
            floating-point, a sparse one is not an accepted form.
        ValueError: shapes: not 2-D/3-D, different ranks or batch sizes,
            ``Incompatible inner dimensions``; indices out of range; dtype or
            device differ; a sparse operand on the meta device (no data to
            check) or an empty list of rows (no width).
        NotImplementedError: both operands sparse, hybrid or other sparse layouts.

    Example::

        >>> A = torch.tensor([[0., 2., 0.], [1., 0., 3.]]).to_sparse().requires_grad_()
        >>> B = torch.tensor([[1., 0.], [0., 1.], [1., 1.]], requires_grad=True)
        >>> C = nnsparse.sparse_mm(A, B)
        >>> C
        tensor([[0., 2.],
                [4., 3.]], grad_fn=<ViewBackward0>)
        >>> C.sum().backward()
        >>> A.grad  # the specified entries only
        tensor(indices=tensor([[0, 1, 1],
                               [1, 0, 2]]),
               values=tensor([1., 1., 2.]),
               size=(2, 3), nnz=3, layout=torch.sparse_coo)
        >>> nnsparse.sparse_mm(torch.ones(1, 2), A)  # dense @ sparse
        tensor([[1., 2., 3.]], grad_fn=<...>)
    """
    a_sparse, b_sparse = is_sparse_form(A), is_sparse_form(B)
    if a_sparse and b_sparse and _holds_no_tensor(B):
        b_sparse = False  # refused as the dense operand, by its own name
    elif a_sparse and b_sparse and _holds_no_tensor(A):
        a_sparse = False
    if a_sparse and b_sparse:
        raise NotImplementedError("sparse_mm multiplies one sparse and one dense operand, got two "
                                  "sparse ones; use torch.sparse.mm for sparse @ sparse")
    if b_sparse:
        return _dense_sparse(A, B)
    if not a_sparse:
        if not isinstance(A, Tensor):
            raise TypeError(f"A must be a sparse or dense torch.Tensor, got {type(A).__name__}"
                            f"{scipy_sparse_hint(A, 'A')}")
        if isinstance(B, Tensor):
            raise TypeError("sparse_mm needs one sparse operand, got two dense tensors; "
                            "use torch.matmul")
        raise TypeError(f"B must be a torch.Tensor, got {type(B).__name__}"
                        f"{scipy_sparse_hint(B, 'B')}")
    return _sparse_dense(A, B)
