"""The test matrix shared by every test module: devices, dtypes, sparse forms, tolerances.

``make_form(dense, form)`` builds each accepted sparse form from a dense
reference whose zeros mean "not specified", so every test compares an
nnsparse result with a dense computation on the same numbers.
"""
from __future__ import annotations

from typing import Any, List

import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")),
]
FLOAT_DTYPES = [torch.float32, torch.float64]
# Every form a batch may take.  "coo_uncoalesced" splits each value in two
# duplicate entries in shuffled order: torch defines duplicates as a sum.
BATCH_FORMS = ["coo", "coo_uncoalesced", "csr", "list", "pair_list"]
VECTOR_FORMS = ["coo", "coo_uncoalesced", "pairs"]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def random_sparse_dense(rows: int, width: int, density: float, *, dtype=torch.float64,
                        device="cpu", generator=None, empty_rows: int = 0) -> torch.Tensor:
    """A dense ``(rows, width)`` tensor whose zeros are the unspecified entries.

    Values are drawn away from 0 so that sparsify/densify round-trips are exact;
    the first ``empty_rows`` rows have no entry.
    """
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    keep = torch.rand(rows, width, generator=g) < density
    values = (torch.rand(rows, width, generator=g) + 0.5) * torch.where(
        torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
    out = torch.where(keep, values, torch.zeros(()))
    out[:empty_rows] = 0
    return out.to(dtype=dtype, device=device)


def make_form(dense: torch.Tensor, form: str) -> Any:
    """The sparse form ``form`` of ``dense`` (1-D: a vector, 2-D: a batch)."""
    coo = dense.to_sparse().coalesce()
    if form == "coo":
        return coo
    if form == "coo_uncoalesced":
        index, values = coo.indices(), coo.values()
        index = torch.cat([index, index], dim=1)
        values = torch.cat([values * 0.25, values * 0.75])
        perm = torch.randperm(values.shape[0], generator=torch.Generator().manual_seed(1))
        out = torch.sparse_coo_tensor(index[:, perm.to(index.device)], values[perm.to(values.device)],
                                      dense.shape, check_invariants=False)
        assert not out.is_coalesced()
        return out
    if form == "csr":
        return dense.to_sparse_csr()
    if form == "pairs":
        return _pairs(dense)
    if form == "list":
        return [row.to_sparse() for row in dense]
    if form == "pair_list":
        return [_pairs(row) for row in dense]
    raise ValueError(form)


def _pairs(vector: torch.Tensor) -> torch.Tensor:
    index = vector.nonzero().squeeze(1)
    return torch.stack([index.to(vector.dtype), vector[index]], dim=1)


def rows_of(form_value: Any) -> List[Any]:
    return list(form_value)


class LargestTensor:
    """Records the largest tensor (in elements) any op produces inside the block.

    A ``TorchDispatchMode`` sees every op autograd runs, forward and backward,
    so ``with LargestTensor() as seen: ...; assert seen.numel < rows * width``
    proves a code path never made a dense ``(rows, width)`` tensor.  Sparse
    results count their values only.  ``new_only=True`` skips strided results
    sharing storage with an argument (views, ``detach``, in-place results): only
    new allocations count.
    """

    def __init__(self, new_only: bool = False) -> None:
        self.numel = 0
        self.op = None
        self.new_only = new_only

    def __enter__(self) -> "LargestTensor":
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        outer = self

        def storage(t):
            try:
                return t.untyped_storage().data_ptr() if t.layout == torch.strided else None
            except (RuntimeError, NotImplementedError):
                return None

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                given = ({storage(a) for a in tree_leaves((args, kwargs))
                          if isinstance(a, torch.Tensor)} if outer.new_only else set())
                for t in tree_leaves(out):
                    if not isinstance(t, torch.Tensor) or (
                            given and t.layout == torch.strided and storage(t) in given):
                        continue
                    n = t._values().numel() if t.layout == torch.sparse_coo else (
                        t.values().numel() if t.layout != torch.strided else t.numel())
                    if n > outer.numel:
                        outer.numel, outer.op = n, str(func)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
