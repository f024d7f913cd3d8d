"""Property-based tests: the sparse toolkit, layers and criteria against dense references.

Hypothesis draws a batch (rows 0..6, width 1..9), a pattern (random entries, empty
rows, an empty batch, repeated positions where a form allows them), float32 or
float64 values (finite, 0.0 and negative ones included), and the batch is given in
every accepted sparse form (``docs/naming.md``): COO coalesced and uncoalesced, CSR
(int64 and int32 indices), a list of sparse vectors, a list of pair tensors; a vector
as a 1-D COO tensor or a ``(k, 2)`` pair tensor.  Every public function must agree with
the dense reference of its documented semantics, whatever the form.

``tests/conftest.py`` loads the project's hypothesis profile (derandomized, no example
database, no deadline) so that a run is deterministic; ``SETTINGS`` and ``FEW`` only set
how many examples.  To hunt, raise
``max_examples`` and drop ``derandomize`` locally (thousands of examples per property
ran clean before this file was committed).  What the properties found is pinned by the
``test_regression_*`` rows at the end.
"""
import contextlib
import copy
import math
import pickle
from dataclasses import dataclass
from typing import Dict, List, Tuple
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import nnsparse
from nnsparse import _kernels
from nnsparse import (Batchifier, Densify, DynamicSparseTensor, MaskCriterion, SDAECriterion,
                      SDAESparseCriterion, SparseCriterion, SparseLinearBatch, SparseOutputLinear,
                      Sparsify, densify, from_pairs, sparsify, ssort, ssort_by_index, stopk,
                      to_pairs)

SETTINGS = settings(max_examples=60)  # the rest: the profile of tests/conftest.py
FEW = settings(SETTINGS, max_examples=30)

DTYPES = [torch.float32, torch.float64]
# Multiples of 1/8: sums of duplicates are exact in float32, and ties are frequent.
DYADIC = st.integers(-40, 40).map(lambda i: i / 8)
VALUE = st.one_of(DYADIC, st.sampled_from([0.0, -0.0, -1.0]),
                  st.floats(-1e3, 1e3, width=32, allow_subnormal=False))


# -- the drawn batch ---------------------------------------------------------------------

@dataclass
class Case:
    """A batch as raw entries: ``(row, col, value)`` in the order drawn, repeated
    positions allowed (they sum)."""
    rows: int
    width: int
    dtype: torch.dtype
    entries: List[Tuple[int, int, float]]

    @property
    def row(self) -> torch.Tensor:
        return torch.tensor([e[0] for e in self.entries], dtype=torch.int64)

    @property
    def col(self) -> torch.Tensor:
        return torch.tensor([e[1] for e in self.entries], dtype=torch.int64)

    @property
    def values(self) -> torch.Tensor:
        return torch.tensor([e[2] for e in self.entries], dtype=self.dtype)

    def dense(self, values=None) -> torch.Tensor:
        """Duplicates summed, float64 then cast (the reference)."""
        v = self.values if values is None else values
        out = torch.zeros(self.rows, self.width, dtype=torch.float64)
        out = out.index_put((self.row, self.col), v.to(torch.float64), accumulate=True)
        return out.to(v.dtype)

    def specified(self) -> torch.Tensor:
        mask = torch.zeros(self.rows, self.width, dtype=torch.bool)
        mask[self.row, self.col] = True
        return mask

    def coalesced(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(row, col, values)`` of the distinct positions, row-major, duplicates summed."""
        mask = self.specified()
        row, col = mask.nonzero().unbind(1)
        return row, col, self.dense()[row, col]

    def row_entries(self, r: int) -> List[Tuple[int, float]]:
        return [(c, v) for (i, c, v) in self.entries if i == r]


@st.composite
def cases(draw, duplicates=True, min_rows=0, max_rows=6, dtypes=DTYPES, values=VALUE):
    rows = draw(st.integers(min_rows, max_rows))
    width = draw(st.integers(1, 9))
    dtype = draw(st.sampled_from(dtypes))
    entries: List[Tuple[int, int, float]] = []
    if rows:
        # a random subset of positions (empty rows happen), then some repeated
        positions = draw(st.lists(st.tuples(st.integers(0, rows - 1), st.integers(0, width - 1)),
                                  max_size=min(rows * width, 20), unique=True))
        if duplicates and positions:
            positions += draw(st.lists(st.sampled_from(positions), max_size=8))
            positions = draw(st.permutations(positions))
        entries = [(r, c, draw(values)) for r, c in positions]
    return Case(rows, width, dtype, entries)


def _coo(case: Case, values=None, coalesced=False) -> torch.Tensor:
    if coalesced:
        row, col, v = case.coalesced()
        if values is not None:
            v = values
        return torch.sparse_coo_tensor(torch.stack([row, col]), v, (case.rows, case.width)
                                       ).coalesce()
    v = case.values if values is None else values
    return torch.sparse_coo_tensor(torch.stack([case.row, case.col]), v, (case.rows, case.width))


def _csr(case: Case, values=None, index_dtype=torch.int64) -> torch.Tensor:
    row, col, v = case.coalesced()
    if values is not None:
        v = values
    crow = torch.zeros(case.rows + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(row, minlength=case.rows).cumsum(0)
    return torch.sparse_csr_tensor(crow.to(index_dtype), col.to(index_dtype), v,
                                   (case.rows, case.width))


def _rows_of(case: Case, values=None):
    """Per row: the positions (in the drawn order) of its entries in ``case.entries``."""
    v = case.values if values is None else values
    at = [[k for k, e in enumerate(case.entries) if e[0] == r] for r in range(case.rows)]
    return v, at


def _list(case: Case, values=None) -> List[torch.Tensor]:
    v, at = _rows_of(case, values)
    return [torch.sparse_coo_tensor(case.col[k].reshape(1, -1), v[k], (case.width,)) for k in at]


def _pair_list(case: Case, values=None) -> List[torch.Tensor]:
    v, at = _rows_of(case, values)
    return [torch.stack([case.col[k].to(v.dtype), v[k]], 1) for k in at]


# The batch forms; "raw" forms carry the drawn entries (duplicates too), the others the
# coalesced ones.  A pair list declares no width (its largest index + 1).
FORMS = {
    "coo": (lambda c, v=None: _coo(c, v, coalesced=True), False),
    "coo_uncoalesced": (_coo, True),
    "csr": (_csr, False),
    "csr_int32": (lambda c, v=None: _csr(c, v, torch.int32), False),
    "list": (_list, True),
    "pair_list": (_pair_list, True),
}
DECLARED = ["coo", "coo_uncoalesced", "csr", "csr_int32", "list"]


def make(case: Case, form: str, values=None):
    build, _ = FORMS[form]
    return build(case, values)


def leaf_values(case: Case, form: str, dtype=torch.float64) -> torch.Tensor:
    """A leaf of the form's values (raw or coalesced), requiring grad."""
    raw = FORMS[form][1]
    v = case.values if raw else case.coalesced()[2]
    return v.to(dtype).clone().requires_grad_()


def dense_of(case: Case, form: str, values: torch.Tensor) -> torch.Tensor:
    """The dense batch of a form built from ``values`` (differentiably)."""
    if FORMS[form][1]:
        row, col = case.row, case.col
    else:
        row, col, _ = case.coalesced()
    out = values.new_zeros(case.rows, case.width)
    return out.index_put((row, col), values, accumulate=True)


def usable(case: Case, form: str, width_known: bool = False) -> bool:
    """A list form of no rows has no width of its own: a function needs a size for it,
    a layer or a criterion takes its in_features or its estimate's (``width_known``)."""
    return width_known or not (form in ("list", "pair_list") and case.rows == 0)


def exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def close(a, b, dtype=torch.float64):
    """Equal up to rounding.  ``dtype``: the values' own (float32 duplicates are summed in
    float32 by the library, in float64 by the reference, in another order)."""
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a, b, equal_nan=True, **tol)


def vector_forms(case: Case) -> Dict[str, torch.Tensor]:
    """The vector forms of a one-row case: 1-D COO (raw and coalesced), a pair tensor."""
    assert case.rows == 1
    raw = torch.sparse_coo_tensor(case.col.reshape(1, -1), case.values, (case.width,))
    return {"coo_vector": raw, "coo_vector_coalesced": raw.coalesce(),
            "pairs": torch.stack([case.col.to(case.dtype), case.values], 1)}


# -- sparsify / densify / to_pairs / from_pairs ------------------------------------------

@SETTINGS
@given(case=cases())
def test_densify_every_form_gives_the_dense_batch(case):
    want = case.dense()
    spec = case.specified()
    for form in FORMS:
        if not usable(case, form):
            continue
        x = make(case, form)
        got = densify(x, size=(case.rows, case.width))
        close(got, want, case.dtype)
        assert got.dtype == case.dtype and got.shape == (case.rows, case.width), form
        if form in DECLARED:
            assert densify(x).shape == (case.rows, case.width), form
        # a larger size pads with elem
        big = densify(x, elem=-7.0, size=(case.rows + 2, case.width + 1))
        close(big[:case.rows, :case.width], torch.where(spec, want, -7.0), case.dtype)
        assert bool((big[case.rows:] == -7).all() and (big[:, case.width:] == -7).all()), form
        # elem fills the unspecified entries only: an explicit 0 stays 0
        filled = densify(x, elem=math.nan, size=(case.rows, case.width))
        assert torch.equal(filled.isnan(), ~spec), form
        close(filled[spec], want[spec], case.dtype)
    # an empty list needs the size (it holds no dtype: the default one)
    if case.rows == 0:
        exact(densify([], size=(0, case.width)), torch.zeros(0, case.width))


@SETTINGS
@given(case=cases())
def test_to_pairs_from_pairs_every_form(case):
    for form in FORMS:
        if not usable(case, form):
            continue
        x = make(case, form)
        pairs = to_pairs(x)
        assert isinstance(pairs, list) and len(pairs) == case.rows, form
        for r, p in enumerate(pairs):
            assert p.shape[1] == 2 and p.dtype == case.dtype, form
            if form == "pair_list":  # returned as given: order and repeats kept
                exact(p, x[r])
                continue
            # one pair per specified position, indices increasing, duplicates summed
            cols = sorted({c for c, _ in case.row_entries(r)})
            exact(p[:, 0], torch.tensor(cols, dtype=case.dtype))
            close(p[:, 1], case.dense()[r, cols], case.dtype)
        back = from_pairs(pairs, size=case.width) if case.rows else None
        if back is not None:
            assert back.shape == (case.rows, case.width)
            close(back.to_dense(), case.dense(), case.dtype)


@SETTINGS
@given(case=cases(min_rows=1, max_rows=1))
def test_vector_forms_agree(case):
    want = case.dense()[0]
    for form, x in vector_forms(case).items():
        got = densify(x, size=case.width)
        close(got, want, case.dtype)
        assert got.shape == (case.width,), form
        p = to_pairs(x)
        assert p.dim() == 2 and p.shape[1] == 2, form
        close(densify(p, size=case.width), want, case.dtype)
        close(from_pairs(p, size=case.width).to_dense(), want, case.dtype)


@SETTINGS
@given(dense=st.integers(0, 6).flatmap(lambda rows: st.integers(1, 9).flatmap(
           lambda width: st.lists(st.one_of(st.just(0.0), DYADIC), min_size=rows * width,
                                  max_size=rows * width).map(
               lambda v: torch.tensor(v, dtype=torch.float64).reshape(rows, width)))),
       dtype=st.sampled_from(DTYPES), elem=st.sampled_from([0.0, 1.0, -0.5, math.nan]),
       offset=st.integers(0, 3), csr=st.booleans())
def test_sparsify_densify_round_trip(dense, dtype, elem, offset, csr):
    dense = dense.to(dtype)
    layout = torch.sparse_csr if csr else torch.sparse_coo
    s = sparsify(dense, elem=elem, offset=offset, layout=layout)
    assert s.layout == layout and s.dtype == dtype
    assert s.shape == (dense.shape[0], dense.shape[1] + offset)
    keep = ~dense.isnan() if math.isnan(elem) else dense != elem
    assert s._nnz() == int(keep.sum())  # every entry but elem, no more
    if not csr:
        assert s.is_coalesced()
    back = densify(s, elem=elem)
    exact(back[:, offset:], dense)
    if offset:
        fill = torch.full((dense.shape[0], offset), elem, dtype=dtype)
        exact(back[:, :offset], fill)
    # the module is the function
    m = Sparsify(elem=elem, offset=offset, layout=layout)(dense)
    exact(densify(m, elem=elem), back)
    assert m.layout == layout and m._nnz() == s._nnz()
    # and the other way: densify then sparsify drops exactly the elem entries
    exact(Densify(dense.shape[1] + offset, elem=elem)(s), back)


# -- ssort / ssort_by_index / stopk -------------------------------------------------------

def _row_reference(cols: torch.Tensor, vals: torch.Tensor, key: str, descending: bool):
    """One row's entries (cols increasing or in their given order) sorted stably, as
    ``torch.sort(stable=True)`` on the row restricted to them: ties keep that order."""
    order = torch.sort(cols if key == "index" else vals, descending=descending, stable=True).indices
    return vals[order], cols[order]


def _padded(case: Case, key: str, descending: bool, k=None):
    """The sorted batch reference: each row's distinct entries (duplicates summed),
    ``(rows, max_nnz)`` (or ``(rows, k)``), padded at the end."""
    row, col, vals = case.coalesced()
    counts = torch.bincount(row, minlength=case.rows) if case.rows else torch.zeros(0)
    width = int(counts.max()) if case.rows and len(row) else 0
    if k is not None:
        width = k
    if key == "index":
        fill = 0.0
    elif case.dtype.is_floating_point:
        fill = -math.inf if descending else math.inf
    else:  # the integer dtype's bounds
        fill = torch.iinfo(case.dtype).min if descending else torch.iinfo(case.dtype).max
    out_v = torch.full((case.rows, width), fill, dtype=case.dtype)
    out_i = torch.full((case.rows, width), -1, dtype=torch.int64)
    for r in range(case.rows):
        v, i = _row_reference(col[row == r], vals[row == r], key, descending)
        n = min(width, len(v))
        out_v[r, :n], out_i[r, :n] = v[:n], i[:n]
    return out_v, out_i


@SETTINGS
@given(case=cases(), key=st.sampled_from(["value", "index"]), descending=st.booleans())
def test_ssort_every_form_against_torch_sort(case, key, descending):
    sort = ssort if key == "value" else ssort_by_index
    want_v, want_i = _padded(case, key, descending)
    for form in FORMS:
        if not usable(case, form):
            continue
        x = make(case, form)
        got = sort(x, descending=descending)
        if form == "pair_list":
            # the pairs reordered as they are, repeats kept, ties in their given order
            assert isinstance(got, list) and len(got) == case.rows
            for r, p in enumerate(got):
                v, i = _row_reference(x[r][:, 0], x[r][:, 1], key, descending)
                exact(p, torch.stack([i, v], 1))
            continue
        exact(got.indices, want_i)
        close(got.values, want_v, case.dtype)
        assert got.values.dtype == case.dtype, form


@SETTINGS
@given(case=cases(), k=st.integers(0, 11))
def test_stopk_every_form_against_torch_topk(case, k):
    declared_v, declared_i = _padded(case, "value", True, k=min(k, case.width))
    pair_v, pair_i = _padded(case, "value", True, k=k)
    for form in FORMS:
        if not usable(case, form):
            continue
        got = stopk(make(case, form), k)
        want_v, want_i = (declared_v, declared_i) if form in DECLARED else (pair_v, pair_i)
        exact(got.indices, want_i)
        close(got.values, want_v, case.dtype)
    # torch.topk on the dense rows with the unspecified entries at -inf gives the values
    if case.rows and k <= case.width:
        dense = case.dense().masked_fill(~case.specified(), -math.inf)
        close(torch.topk(dense, k, dim=1).values, declared_v, case.dtype)


@SETTINGS
@given(case=cases(min_rows=1, max_rows=1), descending=st.booleans(), k=st.integers(0, 11))
def test_sort_and_topk_of_vectors(case, descending, k):
    for form, x in vector_forms(case).items():
        for key, sort in (("value", ssort), ("index", ssort_by_index)):
            got = sort(x, descending=descending)
            if form == "pairs":
                v, i = _row_reference(x[:, 0], x[:, 1], key, descending)
                exact(got, torch.stack([i, v], 1))
                continue
            want_v, want_i = _padded(case, key, descending)
            exact(got.indices, want_i[0])
            close(got.values, want_v[0], case.dtype)
        kept = k if form == "pairs" else min(k, case.width)  # (pairs declare no width)
        want_v, want_i = _padded(case, "value", True, k=kept)
        got = stopk(x, k)
        exact(got.indices, want_i[0])
        close(got.values, want_v[0], case.dtype)


@SETTINGS
@given(case=cases(duplicates=False), descending=st.booleans())
def test_ssort_gradient_reaches_the_specified_values(case, descending):
    for form in ("coo", "csr", "coo_uncoalesced"):
        values = leaf_values(case, form, case.dtype)
        got = ssort(make(case, form, values), descending=descending)
        finite = got.indices >= 0
        (got.values[finite] * (got.indices[finite] + 1)).sum().backward()
        # each value's gradient is its column + 1
        col = case.col if FORMS[form][1] else case.coalesced()[1]
        exact(values.grad, (col + 1).to(case.dtype))


# -- DynamicSparseTensor against a list of entries -----------------------------------------

def _builder_ops(ndim):
    index = (st.integers(0, 6) if ndim == 1 else
             st.tuples(*[st.integers(0, 4)] * ndim))  # (ndim 3: no CSR, no pairs)
    entry = st.tuples(index, DYADIC)
    ops = [
        st.tuples(st.just("append"), entry),
        st.tuples(st.just("append_row"), entry),
        st.tuples(st.just("extend"), st.lists(entry, max_size=6)),
        st.tuples(st.just("bulk"), st.integers(250, 300)),  # past the first host chunk
        st.tuples(st.just("reset"), st.none()),
        st.tuples(st.just("copy"), entry),
        st.tuples(st.just("pickle"), st.none()),
        st.tuples(st.just("build"), st.none()),
        st.tuples(st.just("refused"), st.sampled_from(
            ["negative", "bool", "float", "length", "value", "extend", "set"])),
    ]
    if ndim == 1:
        ops.append(st.tuples(st.just("set"), st.lists(entry, max_size=6)))
    return st.lists(st.one_of(ops), max_size=12)


def _index_tensor(entries, ndim):
    if not entries:
        return torch.zeros(ndim, 0, dtype=torch.int64)
    return torch.tensor([[i] if ndim == 1 else list(i) for i, _ in entries]).T


def _check_builder(b, ref, ndim, dtype):
    assert len(b) == b.len() == len(ref)
    built = b.build()
    assert built.layout == torch.sparse_coo and built.dtype == dtype
    # the entries in the order added, duplicates kept (they sum)
    exact(built._indices(), _index_tensor(ref, ndim))
    exact(built._values(), torch.tensor([v for _, v in ref], dtype=dtype))
    needed = tuple(int(i.max()) + 1 if i.numel() else 0 for i in _index_tensor(ref, ndim))
    assert tuple(built.shape) == needed
    if ndim == 1:
        pairs = b.build_pairs()
        exact(pairs, torch.tensor([[i, v] for i, v in ref], dtype=dtype).reshape(-1, 2))
    if ndim >= 2:
        size = (5,) * ndim
        dense = torch.zeros(size, dtype=dtype)
        for i, v in ref:
            dense[i] += v
        exact(b.build(size=size).to_dense(), dense)
        if ndim == 2:
            exact(b.build(size=size, layout=torch.sparse_csr).to_dense(), dense)


def _refused_call(b, kind, ndim, dtype):
    """One call the builder must refuse, of the given kind."""
    good = 1 if ndim == 1 else (1,) * ndim
    if kind == "negative":
        b.append(-1 if ndim == 1 else (1,) * (ndim - 1) + (-1,), 1)
    elif kind == "bool":
        b.append(True if ndim == 1 else (True,) * ndim, 1)
    elif kind == "float":
        b.append(1.0 if ndim == 1 else (1.0,) * ndim, 1)
    elif kind == "length":
        b.append((1,) * (ndim + 1), 1)
    elif kind == "value":  # beyond int8's range, or not an int for an integer dtype
        b.append(good, 1000 if dtype == torch.int8 else
                 (0.5 if not dtype.is_floating_point else "x"))
    elif kind == "extend":  # one bad index among good ones: none is added
        index = torch.ones(3, ndim, dtype=torch.int64)
        index[2, -1] = -4
        b.extend(index.reshape(-1) if ndim == 1 else index, torch.ones(3, dtype=dtype))
    elif kind == "set":  # a fractional or negative index (or set on a batch builder)
        bad = [[0, 1], [1.5, 2]] if dtype.is_floating_point else [[0, 1], [-1, 2]]
        b.set(torch.tensor(bad, dtype=dtype))


@SETTINGS
@given(data=st.data(), ndim=st.sampled_from([1, 2, 3]), reserve=st.integers(0, 3),
       mult=st.sampled_from([1.1, 1.5, 2.0, 3.0]),
       dtype=st.sampled_from(DTYPES + [torch.int64, torch.int8]))
def test_dynamic_sparse_tensor_against_a_list(data, ndim, reserve, mult, dtype):
    ops = data.draw(_builder_ops(ndim))
    b = DynamicSparseTensor(reserve=reserve, mult_coef=mult, ndim=ndim, dtype=dtype)
    cast = float if dtype.is_floating_point else (lambda v: int(v * 3))  # (int8: within 127)
    ref: list = []
    for op, arg in ops:
        if op == "append":
            i, v = arg
            b.append(i, cast(v))
            ref.append((i, cast(v)))
        elif op == "append_row":
            i, v = arg
            b.append([i, cast(v)] if ndim == 1 else [*i, cast(v)])
            ref.append((i, cast(v)))
        elif op in ("extend", "set"):
            entries = [(i, cast(v)) for i, v in arg]
            index = _index_tensor(entries, ndim).T
            values = torch.tensor([v for _, v in entries], dtype=dtype)
            if op == "extend":
                b.extend(index.reshape(-1) if ndim == 1 else index, values)
                ref.extend(entries)
            else:
                b.set(torch.stack([index.reshape(-1).to(dtype), values], 1))
                ref = entries
        elif op == "bulk":
            for j in range(arg):
                i = j % 7 if ndim == 1 else (j % 5,) * ndim
                b.append(i, cast(j % 3))
                ref.append((i, cast(j % 3)))
        elif op == "reset":
            b.reset()
            ref = []
        elif op == "copy":  # a copy has its own storage: the original is untouched
            other = copy.copy(b)
            i, v = arg
            other.append(i, cast(v))
            _check_builder(b, ref, ndim, dtype)
            b = other
            ref = ref + [(i, cast(v))]
        elif op == "pickle":
            b = pickle.loads(pickle.dumps(b))
        elif op == "build":  # building leaves the builder as it was
            _check_builder(b, ref, ndim, dtype)
        elif op == "refused":  # a refused call leaves the builder as it was
            with pytest.raises((TypeError, ValueError)):
                _refused_call(b, arg, ndim, dtype)
            _check_builder(b, ref, ndim, dtype)
    _check_builder(b, ref, ndim, dtype)
    assert b.capacity >= len(ref)


# -- layers against nn.Linear on the densified input ---------------------------------------

@contextlib.contextmanager
def _kernel_sizes(small: bool):
    """With ``small``: the kernels' size thresholds made tiny, so that the small batches
    drawn here take the paths of large tables (blocked products, column-major sampled
    products over the used rows, chunked gathers)."""
    if not small:
        yield
        return
    with mock.patch.object(_kernels, "_BLOCK_ABOVE", 0), \
            mock.patch.object(_kernels, "_BLOCK_BYTES", 8), \
            mock.patch.object(_kernels, "_GATHER_CHUNK", 2):
        yield


def _leaf_grad(values: torch.Tensor) -> torch.Tensor:
    """A leaf's gradient; zeros where nothing differentiable reached the result (the
    values of an empty list of rows are no part of it; a hinge loss compares its target).
    Compared with the reference's, which then has none either."""
    return torch.zeros_like(values) if values.grad is None else values.grad


def _grad(p):
    g = p.grad
    return g.to_dense() if g is not None and g.layout != torch.strided else g


@SETTINGS
@given(case=cases(), out=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       layer_kind=st.sampled_from(["auto", "sparse", "dense", "sparse_grad"]),
       bias=st.booleans(), dtype=st.sampled_from([torch.float64, torch.float32]),
       small=st.booleans())
def test_sparse_linear_batch_equals_nn_linear(case, out, seed, layer_kind, bias, dtype, small):
    with _kernel_sizes(small):
        _sparse_linear_batch_equals_nn_linear(case, out, seed, layer_kind, bias, dtype)


def _sparse_linear_batch_equals_nn_linear(case, out, seed, layer_kind, bias, dtype):
    """float64 at a tight tolerance; float32 against the float64 reference, at a
    tolerance scaled by the sizes summed (the kernels sum in another order)."""
    torch.manual_seed(seed)
    sparse_grad = layer_kind == "sparse_grad"
    layer = SparseLinearBatch(case.width, out, bias=bias, sparse_grad=sparse_grad,
                              mode="sparse" if sparse_grad else layer_kind, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(case.rows, out, generator=g, dtype=torch.float64)
    scale = 1.0 + float(case.values.abs().sum()) if dtype == torch.float32 else 0.0

    def check(a, b):
        if dtype == torch.float64:
            return close(a, b)
        torch.testing.assert_close(a.to(torch.float64), b, rtol=1e-4, atol=1e-5 * scale)

    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        layer.zero_grad()
        values = leaf_values(case, form, dtype)
        y = layer(make(case, form, values))
        assert y.shape == (case.rows, out) and y.dtype == dtype
        (y * grad_out.to(dtype)).sum().backward()
        assert _leaf_grad(values).dtype == dtype
        ref_values = values.detach().to(torch.float64).requires_grad_()
        w = layer.weight.detach().to(torch.float64).requires_grad_()
        b = layer.bias.detach().to(torch.float64).requires_grad_() if bias else None
        want = F.linear(dense_of(case, form, ref_values), w, b)
        (want * grad_out).sum().backward()
        check(y, want)
        check(_leaf_grad(values), _leaf_grad(ref_values))
        table = layer.weight_t if sparse_grad else layer.weight
        weight_grad = _grad(table)
        assert weight_grad.dtype == dtype
        if sparse_grad:
            assert table.grad.layout == torch.sparse_coo
            # only the touched columns of the weight (rows of weight_t) are stored
            touched = set(case.col.tolist())
            assert set(table.grad.coalesce().indices()[0].tolist()) <= touched, form
            weight_grad = weight_grad.t()
        check(weight_grad, w.grad)
        if bias:
            check(_grad(layer.bias), b.grad)


@SETTINGS
@given(case=cases(), inp=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       sparse_grad=st.booleans(), bias=st.booleans(), small=st.booleans())
def test_sparse_output_linear_equals_nn_linear_at_the_pattern(case, inp, seed, sparse_grad,
                                                              bias, small):
    with _kernel_sizes(small):
        _sparse_output_linear_equals_nn_linear_at_the_pattern(case, inp, seed, sparse_grad,
                                                              bias)


def _sparse_output_linear_equals_nn_linear_at_the_pattern(case, inp, seed, sparse_grad, bias):
    torch.manual_seed(seed)
    layer = SparseOutputLinear(inp, case.width, bias=bias, sparse_grad=sparse_grad,
                               dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(case.rows, inp, generator=g, dtype=torch.float64)
    grad_out = torch.randn(case.rows, case.width, generator=g, dtype=torch.float64)
    spec = case.specified()
    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        layer.zero_grad()
        h = h0.clone().requires_grad_()
        pattern = make(case, form)
        y = layer(h, pattern)
        assert y.layout == (torch.sparse_csr if form.startswith("csr") else torch.sparse_coo), form
        assert y._nnz() == int(spec.sum()), form  # each position once
        dense_y = densify(y, size=(case.rows, case.width))
        (dense_y * grad_out).sum().backward()
        h_ref = h0.clone().requires_grad_()
        w = layer.weight.detach().clone().requires_grad_()
        b = layer.bias.detach().clone().requires_grad_() if bias else None
        want = F.linear(h_ref, w, b) * spec
        (want * grad_out).sum().backward()
        close(dense_y, want)
        close(h.grad, h_ref.grad)
        close(_grad(layer.weight), w.grad)
        if bias:
            close(_grad(layer.bias), b.grad)
    # no pattern: nn.Linear
    close(layer(h0), F.linear(h0, layer.weight, layer.bias))


# -- criteria against a dense masked loss ------------------------------------------------------

# (the loss, its element-wise form for the reference)
LOSSES = {
    "mse": (lambda: nn.MSELoss(), lambda x, y: (x - y) ** 2),
    "l1": (lambda: nn.L1Loss(), lambda x, y: (x - y).abs()),
    "smooth_l1": (lambda: nn.SmoothL1Loss(beta=0.5),
                  lambda x, y: F.smooth_l1_loss(x, y, beta=0.5, reduction="none")),
    "huber": (lambda: nn.HuberLoss(delta=0.7),
              lambda x, y: F.huber_loss(x, y, delta=0.7, reduction="none")),
    "bce_logits": (lambda: nn.BCEWithLogitsLoss(),
                   lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction="none")),
    "mse_sum": (lambda: nn.MSELoss(reduction="sum"), lambda x, y: (x - y) ** 2),
}


def _column_weight(width: int) -> torch.Tensor:
    return torch.arange(1, width + 1, dtype=torch.float64) / width


# Every loss with an element-wise form (``nnsparse/criteria/_elementwise.py``), with its
# weight tensors: ``factory(width, reduction)``.  The reference is the same loss with
# reduction='none' on the dense tensors, its weights broadcast to the dense shape.
# ``"bce"`` reads probabilities: its estimate goes through a sigmoid first.
ALL_LOSSES = {
    "mse": lambda w, r: nn.MSELoss(reduction=r),
    "l1": lambda w, r: nn.L1Loss(reduction=r),
    "smooth_l1": lambda w, r: nn.SmoothL1Loss(beta=0.5, reduction=r),
    "huber": lambda w, r: nn.HuberLoss(delta=0.7, reduction=r),
    "bce": lambda w, r: nn.BCELoss(weight=0.5 + _column_weight(w), reduction=r),
    "bce_logits": lambda w, r: nn.BCEWithLogitsLoss(reduction=r),
    "bce_logits_weights": lambda w, r: nn.BCEWithLogitsLoss(
        weight=_column_weight(w).flip(0), pos_weight=_column_weight(w) + 0.25, reduction=r),
    "soft_margin": lambda w, r: nn.SoftMarginLoss(reduction=r),
    "poisson_nll": lambda w, r: nn.PoissonNLLLoss(reduction=r),
    "poisson_nll_full": lambda w, r: nn.PoissonNLLLoss(log_input=False, full=True, reduction=r),
    "kl_div_log_target": lambda w, r: nn.KLDivLoss(log_target=True, reduction=r),
    "hinge_embedding": lambda w, r: nn.HingeEmbeddingLoss(margin=0.8, reduction=r),
}


def _estimate(case: Case, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(case.rows, case.width, generator=g, dtype=torch.float64)


def _sparse_estimate(est: torch.Tensor, kind: str):
    """A sparse estimate over every position, whose values are a leaf; ``"coo_split"``:
    uncoalesced, each position's value given as two duplicates (a quarter and the rest),
    the leaf then holds the two halves one after the other."""
    rows, width = est.shape
    index = torch.stack(torch.meshgrid(torch.arange(rows), torch.arange(width),
                                       indexing="ij")).reshape(2, -1)
    if kind == "coo_split":
        flat = est.reshape(-1)
        values = torch.cat([flat / 4, flat * 3 / 4]).requires_grad_()
        coo = torch.sparse_coo_tensor(index.repeat(1, 2), values, (rows, width))
        return coo, _Halves(values)
    values = est.reshape(-1).clone().requires_grad_()
    coo = torch.sparse_coo_tensor(index, values, (rows, width)).coalesce()
    return (coo if kind == "coo" else coo.to_sparse_csr()), values


class _Halves:
    """The leaf of a ``"coo_split"`` estimate: both duplicates get their position's gradient."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    @property
    def grad(self) -> torch.Tensor:
        first, second = self.values.grad.chunk(2)
        torch.testing.assert_close(first, second, rtol=0, atol=0, equal_nan=True)
        return first


@SETTINGS
@given(case=cases(), loss=st.sampled_from(sorted(ALL_LOSSES) + ["mse_sum"]),
       seed=st.integers(0, 2 ** 16),
       averaging=st.sampled_from(["size", "full", "none"]), estimate_kind=st.sampled_from(
           ["dense", "coo", "csr", "coo_split"]))
def test_sparse_criterion_against_a_dense_masked_loss(case, loss, seed, averaging,
                                                     estimate_kind):
    if loss == "mse_sum":  # reduction='sum' means size_average=False
        averaging, module = "none", nn.MSELoss(reduction="sum")
        elementwise = nn.MSELoss(reduction="none")
    else:
        module = ALL_LOSSES[loss](case.width, "mean")
        elementwise = ALL_LOSSES[loss](case.width, "none")
    crit = SparseCriterion(module, size_average=averaging == "size",
                           full_size_average=averaging == "full")
    est0 = _estimate(case, seed)
    if loss in ("bce", "poisson_nll_full"):  # probabilities, rates
        est0 = torch.sigmoid(est0)
    if loss == "bce":  # targets in [0, 1], duplicates included
        count = {}
        for r, c, _ in case.entries:
            count[r, c] = count.get((r, c), 0) + 1
        case = Case(case.rows, case.width, case.dtype, [
            (r, c, (math.tanh(v) + 1) / 2 / count[r, c]) for r, c, v in case.entries])
    # torch has no gradient of soft_margin_loss for its target
    target_grad = loss != "soft_margin"
    spec = case.specified()
    divisor = {"size": max(int(spec.sum()), 1), "full": max(est0.numel(), 1),
               "none": 1}[averaging]
    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        if estimate_kind == "dense":
            est = est0.clone().requires_grad_()
            leaf = est
        else:
            est, leaf = _sparse_estimate(est0, estimate_kind)
        target_values = leaf_values(case, form, case.dtype).requires_grad_(target_grad)
        got = crit(est, make(case, form, target_values))
        got.backward()
        ref_est = est0.clone().requires_grad_()
        ref_target = leaf_values(case, form, case.dtype).requires_grad_(target_grad)
        y = dense_of(case, form, ref_target).to(torch.float64)
        want = elementwise(ref_est, y)[spec].sum() / divisor
        want.backward()
        assert got.dtype == torch.float64 and got.shape == ()
        close(got, want, case.dtype)
        close(leaf.grad.reshape(case.rows, case.width), ref_est.grad, case.dtype)
        if target_grad:
            close(_leaf_grad(target_values), _leaf_grad(ref_target), case.dtype)


def _widen(mask: torch.Tensor, width: int) -> torch.Tensor:
    """A prepared batch's dense mask padded with False to ``width`` columns."""
    return F.pad(mask, (0, width - mask.shape[-1]), value=False)


def _weights(mask: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    return torch.where(mask, alpha, beta).to(torch.float64)


@SETTINGS
@given(case=cases(), loss=st.sampled_from(["mse", "l1", "huber"]), seed=st.integers(0, 2 ** 16),
       alpha=st.sampled_from([0.0, 1.0, 2.5]), beta=st.sampled_from([0.0, 0.5, 1.0]),
       size_average=st.booleans())
def test_sdae_criterion_with_a_mask_against_a_dense_masked_loss(case, loss, seed, alpha, beta,
                                                               size_average):
    make_loss, elementwise = LOSSES[loss]
    est0 = _estimate(case, seed)
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(est0.shape, generator=g) < 0.4
    target = case.dense().to(torch.float64)
    crit = SDAECriterion(make_loss(), alpha=alpha, beta=beta, size_average=size_average)
    est = est0.clone().requires_grad_()
    got = crit(est, target, mask=mask)
    got.backward()
    ref = est0.clone().requires_grad_()
    want = (elementwise(ref, target) * _weights(mask, alpha, beta)).sum()
    want = want / max(est0.numel(), 1) if size_average else want
    want.backward()
    close(got, want, case.dtype)
    close(est.grad, ref.grad, case.dtype)


@SETTINGS
@given(case=cases(), seed=st.integers(0, 2 ** 16),
       ratios=st.sampled_from([(0.0, 0.0, 0.5), (0.5, 0.0, 0.0), (0.0, 0.5, 0.0),
                               (0.3, 0.3, 0.3), (0.0, 0.0, 1.0)]))
def test_sdae_criterion_prepare_input_corrupts_the_masked_entries_only(case, seed, ratios):
    noise, flip, hide = ratios
    x = case.dense().to(torch.float64)
    crit = SDAECriterion(nn.MSELoss(), noise_ratio=noise, flip_ratio=flip, hide_ratio=hide,
                         flip_range=(-2.0, 3.0), generator=torch.Generator().manual_seed(seed))
    out = crit.prepare_input(x)
    mask = crit.mask_alpha
    assert mask.shape == x.shape and mask.dtype == torch.bool
    exact(out[~mask], x[~mask])
    exact(crit.mask_beta, ~mask)
    if flip == 0 and noise == 0:
        assert bool((out[mask] == 0).all())
    if noise == 0 and hide == 0:
        assert bool(((out[mask] == -2.0) | (out[mask] == 3.0)).all())
    # the same seed, the same corruption
    again = SDAECriterion(nn.MSELoss(), noise_ratio=noise, flip_ratio=flip, hide_ratio=hide,
                          flip_range=(-2.0, 3.0), generator=torch.Generator().manual_seed(seed))
    exact(again.prepare_input(x), out)
    # the remembered mask is the one a mask= call gives
    est = _estimate(case, seed)
    close(crit(est, x), crit(est, x, mask=mask))


@SETTINGS
@given(case=cases(), loss=st.sampled_from(["mse", "l1", "smooth_l1"]),
       seed=st.integers(0, 2 ** 16), alpha=st.sampled_from([0.0, 1.0, 2.5]),
       beta=st.sampled_from([0.0, 0.5, 1.0]), size_average=st.booleans(),
       estimate_kind=st.sampled_from(["dense", "coo", "csr", "coo_split"]))
def test_sdae_sparse_criterion_against_a_dense_masked_loss(case, loss, seed, alpha, beta,
                                                          size_average, estimate_kind):
    make_loss, elementwise = LOSSES[loss]
    est0 = _estimate(case, seed)
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(est0.shape, generator=g) < 0.4
    spec = case.specified()
    y = case.dense().to(torch.float64)
    divisor = max(int(spec.sum()), 1) if size_average else 1
    ref = est0.clone().requires_grad_()
    want = (elementwise(ref, y) * _weights(mask, alpha, beta))[spec].sum() / divisor
    want.backward()
    crit = SDAESparseCriterion(make_loss(), alpha=alpha, beta=beta, size_average=size_average)
    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        if estimate_kind == "dense":
            est = leaf = est0.clone().requires_grad_()
        else:
            est, leaf = _sparse_estimate(est0, estimate_kind)
        got = crit(est, make(case, form), mask=mask)
        got.backward()
        close(got, want, case.dtype)
        close(leaf.grad.reshape(case.rows, case.width), ref.grad, case.dtype)


@SETTINGS
@given(case=cases(), seed=st.integers(0, 2 ** 16), hide=st.sampled_from([0.0, 0.5, 1.0]),
       alpha=st.sampled_from([1.0, 2.5]), beta=st.sampled_from([0.0, 0.5]))
def test_sdae_sparse_criterion_prepare_input_every_form(case, seed, hide, alpha, beta):
    spec = case.specified()
    y = case.dense()
    est = _estimate(case, seed)
    for form in FORMS:
        if not usable(case, form):
            continue
        crit = SDAESparseCriterion(nn.MSELoss(), alpha=alpha, beta=beta, hide_ratio=hide,
                                   generator=torch.Generator().manual_seed(seed))
        x = make(case, form)
        out = crit.prepare_input(x)
        # in the input's form, on its pattern (coalesced: one entry per position)
        if form in ("coo", "coo_uncoalesced", "csr", "csr_int32"):
            assert isinstance(out, torch.Tensor) and out.layout == x.layout, form
        else:
            assert isinstance(out, list) and len(out) == case.rows, form
        # the prepared batch's shape: a pair list's width is its largest index + 1
        mask, beta_mask = _widen(crit.mask_alpha, case.width), _widen(crit.mask_beta, case.width)
        exact(beta_mask, spec & ~mask)
        assert not bool((mask & ~spec).any()), form  # only specified entries corrupted
        got = densify(out, size=(case.rows, case.width))
        close(got[~mask], y[~mask], case.dtype)  # the others untouched, duplicates summed
        assert bool((got[mask] == 0).all()), form
        if hide == 1.0:
            exact(mask, spec)
        # the remembered mask is the one mask= gives, whatever the target's form
        for target_form in ("coo_uncoalesced", "csr"):
            target = make(case, target_form)
            close(crit(est, target), crit(est, target, mask=mask))


def _pattern(x, case: Case) -> torch.Tensor:
    """The specified positions of a sparse form, as a dense bool ``(rows, width)``."""
    return ~densify(x, elem=math.nan, size=(case.rows, case.width)).isnan()


@SETTINGS
@given(case=cases(dtypes=[torch.float64]), loss=st.sampled_from(["mse", "l1", "huber"]),
       seed=st.integers(0, 2 ** 16), hide=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       alpha=st.sampled_from([1.0, 2.5]), beta=st.sampled_from([0.0, 0.5]),
       size_average=st.booleans(),
       estimate_kind=st.sampled_from(["dense", "coo", "csr", "coo_split"]))
def test_mask_criterion_sparse_input_against_a_dense_masked_loss(
        case, loss, seed, hide, alpha, beta, size_average, estimate_kind):
    make_loss, elementwise = LOSSES[loss]
    spec = case.specified()
    y = case.dense()
    est0 = _estimate(case, seed)
    for form in FORMS:
        if not usable(case, form):
            continue
        crit = MaskCriterion(make_loss(), alpha=alpha, beta=beta, hide_ratio=hide,
                             generator=torch.Generator().manual_seed(seed),
                             size_average=size_average)
        x = make(case, form)
        out = crit.prepare_input(x)
        kept = _pattern(out, case)
        assert not bool((kept & ~spec).any()), form
        hidden = spec & ~kept
        # a row keeps one entry at least; the kept values are the input's (summed)
        assert bool((kept.any(1) == spec.any(1)).all()), form
        close(densify(out, size=(case.rows, case.width))[kept], y[kept])
        if hide in (0.0, 1.0):  # nothing, or every entry of a row, which then keeps them all
            assert not bool(hidden.any()), form
        ref = est0.clone().requires_grad_()
        want = (elementwise(ref, y) * _weights(hidden, alpha, beta))[spec].sum()
        want = want / max(est0.numel(), 1) if size_average else want
        want.backward()
        for target in (make(case, form), y):
            if estimate_kind == "dense":
                est = leaf = est0.clone().requires_grad_()
            else:
                est, leaf = _sparse_estimate(est0, estimate_kind)
            got = crit(est, target)
            got.backward()
            close(got, want)
            close(leaf.grad.reshape(case.rows, case.width), ref.grad)


@SETTINGS
@given(case=cases(min_rows=1, dtypes=[torch.float64]), seed=st.integers(0, 2 ** 16),
       hide=st.sampled_from([0.0, 0.3, 0.5, 1.0]), alpha=st.sampled_from([1.0, 2.5]),
       beta=st.sampled_from([0.0, 0.5]))
def test_mask_criterion_dense_input_against_a_dense_masked_loss(case, seed, hide, alpha, beta):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(case.rows, case.width, generator=g, dtype=torch.float64) + 0.5  # no zero
    crit = MaskCriterion(nn.MSELoss(), alpha=alpha, beta=beta, hide_ratio=hide,
                         generator=torch.Generator().manual_seed(seed))
    out = crit.prepare_input(x)
    hidden = out == 0
    # floor(n * hide_ratio) distinct entries of each row set to 0, the others kept
    assert hidden.sum(1).tolist() == [int(case.width * hide)] * case.rows
    exact(out[~hidden], x[~hidden])
    est0 = _estimate(case, seed)
    for target in (case.dense(), make(case, "csr")):
        est = est0.clone().requires_grad_()
        got = crit(est, target)
        got.backward()
        ref = est0.clone().requires_grad_()
        want = ((ref - case.dense()) ** 2 * _weights(hidden, alpha, beta)).sum() / est0.numel()
        want.backward()
        close(got, want)
        close(est.grad, ref.grad)


# -- the modules against the functions ----------------------------------------------------------

@SETTINGS
@given(case=cases(), elem=st.sampled_from([0.0, -1.0, math.nan]), extra=st.integers(0, 2))
def test_densify_module_is_the_function(case, elem, extra):
    width = case.width + extra  # the input may be narrower than in_features
    layer = Densify(width, elem=elem)
    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        x = make(case, form)
        exact(layer(x), densify(x, elem=elem, size=(case.rows, width)))
    if case.rows == 1:
        for form, x in vector_forms(case).items():
            exact(layer(x), densify(x, elem=elem, size=width))


@FEW
@given(case=cases(dtypes=[torch.float64]), out=st.integers(1, 5), batch_size=st.integers(1, 4),
       layout=st.sampled_from([torch.sparse_csr, torch.sparse_coo]), seed=st.integers(0, 2 ** 16),
       k=st.integers(0, 5))
def test_batchifier_is_the_network_on_the_dense_batch(case, out, batch_size, layout, seed, k):
    torch.manual_seed(seed)
    net = nn.Sequential(SparseLinearBatch(case.width, 3, dtype=torch.float64), nn.Tanh(),
                        nn.Linear(3, out, dtype=torch.float64))
    dense_net = nn.Sequential(nn.Linear(case.width, 3, dtype=torch.float64), nn.Tanh(),
                              nn.Linear(3, out, dtype=torch.float64))
    dense_net.load_state_dict(net.state_dict())
    with torch.no_grad():
        want = dense_net(case.dense())
    run = Batchifier(net, out, batch_size=batch_size, progress=False, layout=layout)
    k = min(k, out)
    for form in FORMS:
        if not usable(case, form):
            continue
        x = make(case, form)
        close(run(x), want)
        best = run.topk(x, k)
        close(best.values, torch.topk(want, k, dim=1).values)
        close(torch.gather(want, 1, best.indices), best.values)
    close(run(case.dense()), want)  # a dense batch: its row slices
    if out >= case.width:
        # exclude=True: the rows' specified entries score -inf before the top k
        spec = F.pad(case.specified(), (0, out - case.width))
        worst = want.masked_fill(spec, -math.inf)
        for form in ("coo_uncoalesced", "csr", "list"):
            if not usable(case, form):
                continue
            best = run.topk(make(case, form), k, exclude=True)
            close(best.values, torch.topk(worst, k, dim=1).values)


# -- vectors: one sample, through the layers and a criterion ----------------------------------

@SETTINGS
@given(case=cases(min_rows=1, max_rows=1, dtypes=[torch.float64]), out=st.integers(1, 4),
       seed=st.integers(0, 2 ** 16), sparse_grad=st.booleans())
def test_layers_and_criterion_on_vectors(case, out, seed, sparse_grad):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    dense = case.dense()[0]
    encoder = SparseLinearBatch(case.width, out, sparse_grad=sparse_grad, dtype=torch.float64)
    decoder = SparseOutputLinear(out, case.width, sparse_grad=sparse_grad, dtype=torch.float64)
    grad_out = torch.randn(out, generator=g, dtype=torch.float64)
    spec = case.specified()[0]
    for form in ("coo_vector", "coo_vector_coalesced"):
        encoder.zero_grad()
        raw = form == "coo_vector"
        values = (case.values if raw else case.coalesced()[2]).clone().requires_grad_()
        col = case.col if raw else case.coalesced()[1]
        x = torch.sparse_coo_tensor(col.reshape(1, -1), values, (case.width,))
        if not raw:
            x = x.coalesce()
        y = encoder(x)
        assert y.shape == (out,)
        (y * grad_out).sum().backward()
        ref_values = values.detach().clone().requires_grad_()
        w = encoder.weight.detach().clone().requires_grad_()
        want = F.linear(torch.zeros(case.width, dtype=torch.float64).index_put(
            (col,), ref_values, accumulate=True), w, encoder.bias.detach())
        (want * grad_out).sum().backward()
        close(y, want)
        close(values.grad, ref_values.grad)
        close(_grad(encoder.weight_t).t() if sparse_grad else encoder.weight.grad, w.grad)
        # the decoder on the vector's pattern: a sparse vector at the pattern
        h = torch.randn(out, generator=g, dtype=torch.float64)
        z = decoder(h, x.detach())
        assert z.shape == (case.width,) and z.layout == torch.sparse_coo
        close(densify(z, size=case.width), F.linear(h, decoder.weight, decoder.bias) * spec)
    # a criterion on a 1-D estimate: every vector form of the target, the lone pair tensor too
    crit = SparseCriterion(nn.MSELoss())
    est0 = torch.randn(case.width, generator=g, dtype=torch.float64)
    ref = est0.clone().requires_grad_()
    want = ((ref - dense) ** 2)[spec].sum() / max(int(spec.sum()), 1)
    want.backward()
    for form, target in vector_forms(case).items():
        est = est0.clone().requires_grad_()
        got = crit(est, target)
        got.backward()
        close(got, want)
        close(est.grad, ref.grad)


# -- sparse_mm and values_map, every form -------------------------------------------------------

@SETTINGS
@given(case=cases(), p=st.integers(1, 4), seed=st.integers(0, 2 ** 16))
def test_sparse_mm_every_form_against_the_dense_product(case, p, seed):
    g = torch.Generator().manual_seed(seed)
    b0 = torch.randn(case.width, p, generator=g, dtype=torch.float64)
    d0 = torch.randn(p, case.rows, generator=g, dtype=torch.float64)
    for form in FORMS:
        if not usable(case, form):
            continue
        for side in ("left", "right"):
            values = leaf_values(case, form)
            other = (b0 if side == "left" else d0).clone().requires_grad_()
            x = make(case, form, values)
            got = nnsparse.sparse_mm(x, other) if side == "left" else nnsparse.sparse_mm(other, x)
            ref_values = values.detach().clone().requires_grad_()
            ref_other = other.detach().clone().requires_grad_()
            dense = dense_of(case, form, ref_values)
            want = dense @ ref_other if side == "left" else ref_other @ dense
            if side == "right" and form == "pair_list":
                # dense @ pair rows: the rows declare no width, their largest index + 1 is
                want = want[:, :int(case.col.max()) + 1 if case.entries else 0]
            close(got, want)
            grad_out = torch.randn(want.shape, generator=g, dtype=torch.float64)
            (got * grad_out).sum().backward()
            (want * grad_out).sum().backward()
            close(values.grad, ref_values.grad)
            close(other.grad, ref_other.grad)


@SETTINGS
@given(case=cases(), fn=st.sampled_from(["affine", "tanh", "relu"]))
def test_values_map_every_form(case, fn):
    f = {"affine": lambda v: 2 * v + 1, "tanh": torch.tanh, "relu": nn.ReLU()}[fn]
    spec = case.specified()
    for form in FORMS:
        if not usable(case, form):
            continue
        values = leaf_values(case, form, case.dtype)
        x = make(case, form, values)
        y = nnsparse.values_map(f, x)
        # the form is kept, each position once (fn of the sum of its duplicates)
        if form in ("coo", "coo_uncoalesced", "csr", "csr_int32"):
            assert y.layout == x.layout, form
            assert y._nnz() == int(spec.sum()), form
        else:
            assert isinstance(y, list) and len(y) == case.rows, form
        got = densify(y, elem=math.nan, size=(case.rows, case.width))
        ref_values = values.detach().clone().requires_grad_()
        dense = dense_of(case, form, ref_values)
        want = torch.where(spec, f(dense), math.nan)
        close(got, want, case.dtype)
        weight = torch.arange(1.0, case.rows * case.width + 1).reshape(case.rows, case.width)
        (densify(y, size=(case.rows, case.width)) * weight).sum().backward()
        (f(dense)[spec] * weight[spec]).sum().backward()
        close(values.grad, ref_values.grad, case.dtype)


# -- a sparse tensor that is itself the leaf: its gradient, its layout, its pattern ------------

def _consumers(case: Case, seed: int):
    """``name -> (fn of the sparse batch, fn of its dense equivalent)``, the same scalar."""
    g = torch.Generator().manual_seed(seed)
    rows, width = case.rows, case.width
    weight = torch.randn(rows, width, generator=g, dtype=torch.float64)
    torch.manual_seed(seed)
    layer = SparseLinearBatch(width, 2, dtype=torch.float64)
    layer_sparse = SparseLinearBatch(width, 2, dtype=torch.float64, sparse_grad=True)
    grad_out = torch.randn(rows, 2, generator=g, dtype=torch.float64)
    b = torch.randn(width, 2, generator=g, dtype=torch.float64)
    est = torch.randn(rows, width, generator=g, dtype=torch.float64)
    spec = case.specified()
    nnz = max(int(spec.sum()), 1)
    crit = SparseCriterion(nn.MSELoss())
    return {
        "densify": (lambda x: (densify(x, size=(rows, width)) * weight).sum(),
                    lambda d: (d * weight).sum()),
        "linear": (lambda x: (layer(x) * grad_out).sum(),
                   lambda d: (F.linear(d, layer.weight, layer.bias) * grad_out).sum()),
        "linear_sparse_grad": (lambda x: (layer_sparse(x) * grad_out).sum(),
                               lambda d: (F.linear(d, layer_sparse.weight, layer_sparse.bias)
                                          * grad_out).sum()),
        "criterion_target": (lambda x: crit(est, x), lambda d: ((est - d) ** 2)[spec].sum() / nnz),
        "sparse_mm": (lambda x: (nnsparse.sparse_mm(x, b) * grad_out).sum(),
                      lambda d: ((d @ b) * grad_out).sum()),
        "values_map": (lambda x: (densify(nnsparse.values_map(torch.tanh, x), size=(rows, width))
                                  * weight).sum(),
                       lambda d: (torch.tanh(d) * weight)[spec].sum()),
        "stopk": (lambda x: (lambda r: (r.values * (r.indices >= 0)).nan_to_num(0, 0, 0).sum())(
                      stopk(x, width)),
                  lambda d: d[spec].sum()),
    }


@SETTINGS
@given(case=cases(dtypes=[torch.float64]), seed=st.integers(0, 2 ** 16),
       form=st.sampled_from(["coo", "coo_uncoalesced", "csr"]))
def test_a_sparse_leaf_gets_its_gradient_at_its_pattern(case, seed, form):
    spec = case.specified()
    for name, (sparse_fn, dense_fn) in _consumers(case, seed).items():
        x = make(case, form).detach().requires_grad_()
        d = case.dense().requires_grad_()
        got, want = sparse_fn(x), dense_fn(d)
        close(got, want)
        got.backward()
        want.backward()
        if x.grad is None:  # no entry at all: nothing to differentiate
            assert not bool(spec.any()), name
            continue
        assert x.grad.layout == x.layout, name
        close(x.grad.to_dense(), d.grad * spec)


@SETTINGS
@given(case=cases(), key=st.sampled_from(["value", "index"]), descending=st.booleans())
def test_ssort_inplace_on_pair_forms_is_the_returned_sort(case, key, descending):
    sort = ssort if key == "value" else ssort_by_index
    if case.rows:
        rows = make(case, "pair_list")
        want = sort(rows, descending=descending)
        copies = [r.clone() for r in rows]
        got = sort(copies, descending=descending, inplace=True)
        assert got is copies
        for p, q in zip(copies, want):
            exact(p, q)
    if case.rows == 1:
        pairs = vector_forms(case)["pairs"]
        want = sort(pairs, descending=descending)
        copy_ = pairs.clone()
        assert sort(copy_, descending=descending, inplace=True) is copy_
        exact(copy_, want)


# -- a sparse autoencoder's step: decoder output on the target's pattern, then the loss ---------

@SETTINGS
@given(case=cases(), inp=st.integers(1, 3), seed=st.integers(0, 2 ** 16),
       sparse_grad=st.booleans(), criterion=st.sampled_from(["sparse", "sdae", "mask"]),
       small=st.booleans())
def test_decoder_output_into_a_criterion_equals_the_dense_step(case, inp, seed, sparse_grad,
                                                              criterion, small):
    with _kernel_sizes(small):
        _decoder_output_into_a_criterion_equals_the_dense_step(case, inp, seed, sparse_grad,
                                                               criterion)


def _decoder_output_into_a_criterion_equals_the_dense_step(case, inp, seed, sparse_grad, criterion):
    torch.manual_seed(seed)
    decoder = SparseOutputLinear(inp, case.width, sparse_grad=sparse_grad, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(case.rows, inp, generator=g, dtype=torch.float64)
    mask = torch.rand(case.rows, case.width, generator=g) < 0.5
    spec = case.specified()
    y = case.dense().to(torch.float64)
    for form in FORMS:
        if not usable(case, form, width_known=True):
            continue
        target = make(case, form)
        if criterion == "sparse":
            crit = SparseCriterion(nn.MSELoss())
            weights = spec.to(torch.float64)
            divisor = max(int(spec.sum()), 1)
        elif criterion == "sdae":
            crit = SDAESparseCriterion(nn.MSELoss(), alpha=2.0, beta=0.5)
            weights = _weights(mask, 2.0, 0.5) * spec
            divisor = max(int(spec.sum()), 1)
        else:  # nothing hidden (hide_ratio=0): beta on every observed entry
            if not usable(case, form):  # prepare_input has no width to give an empty list
                continue
            crit = MaskCriterion(nn.MSELoss(), alpha=2.0, beta=0.5, hide_ratio=0.0)
            crit.prepare_input(target)
            weights = 0.5 * spec.to(torch.float64)
            divisor = max(case.rows * case.width, 1)
        decoder.zero_grad()
        h = h0.clone().requires_grad_()
        out = decoder(h, target)
        loss = crit(out, target, mask=mask) if criterion == "sdae" else crit(out, target)
        loss.backward()
        h_ref = h0.clone().requires_grad_()
        w = decoder.weight.detach().clone().requires_grad_()
        b = decoder.bias.detach().clone().requires_grad_()
        want = (((F.linear(h_ref, w, b) - y) ** 2) * weights).sum() / divisor
        want.backward()
        close(loss, want, case.dtype)
        close(h.grad, h_ref.grad, case.dtype)
        close(_grad(decoder.weight), w.grad, case.dtype)
        close(_grad(decoder.bias), b.grad, case.dtype)


@SETTINGS
@given(case=cases(dtypes=[torch.int64, torch.int32, torch.int16],
                  values=st.integers(-6, 6).map(float)),
       descending=st.booleans(), k=st.integers(0, 11))
def test_integer_values_through_the_toolkit(case, descending, k):
    """Integer values: densify, to_pairs, the sorts and top-k (padding with the dtype's
    bounds) in every form, exactly."""
    want = case.dense()
    sorted_v, sorted_i = _padded(case, "value", descending)
    top_v, top_i = _padded(case, "value", True, k=min(k, case.width))
    for form in DECLARED:
        if not usable(case, form):
            continue
        x = make(case, form)
        got = densify(x, size=(case.rows, case.width))
        exact(got, want)
        for r, p in enumerate(to_pairs(x)):
            assert p.dtype == case.dtype
            exact(densify(p, size=case.width), want[r])
        got = ssort(x, descending=descending)
        exact(got.values, sorted_v)
        exact(got.indices, sorted_i)
        got = stopk(x, k)
        exact(got.values, top_v)
        exact(got.indices, top_i)


# -- regressions the properties found, one row each ------------------------------------------

def _pair_rows_repeating_an_index():
    """A narrow layer (in_features=1) on pair rows that repeat index 0: more entries (3)
    than the (rows, in_features) = (2, 1) product of the values' gradient has elements,
    which torch's sampled_addmm refused ("torch.copy_: only sparse compressed tensors
    with the same number of specified elements are supported")."""
    values = torch.tensor([1.0, 2.0, -3.0], dtype=torch.float64, requires_grad=True)
    x = [torch.stack([torch.zeros(2, dtype=torch.float64), values[:2]], 1),
         torch.stack([torch.zeros(1, dtype=torch.float64), values[2:]], 1)]
    dense = torch.stack([values[:2].sum(), values[2]]).reshape(2, 1)
    return x, values, dense


@pytest.mark.parametrize("layer_kind", ["auto", "sparse", "sparse_grad"])
def test_regression_linear_backward_with_more_entries_than_the_product(layer_kind):
    torch.manual_seed(0)
    layer = SparseLinearBatch(1, 1, sparse_grad=layer_kind == "sparse_grad",
                              mode="auto" if layer_kind == "auto" else "sparse",
                              dtype=torch.float64)
    x, values, _ = _pair_rows_repeating_an_index()
    layer(x).sum().backward()
    close(values.grad, layer.weight.detach().reshape(1).expand(3))


# An empty list of rows (a batch of no rows) holds no width, dtype nor device: where the
# caller has them (a layer's weight, a criterion's estimate) it is that empty batch.  A
# float64 layer refused it ("input must have the weight's dtype torch.float64, got
# torch.float32") and a criterion refused it as a target ("target is an empty list; pass a
# size to give its width", where no size can be passed).
@pytest.mark.parametrize("call, shape", [
    (lambda: SparseLinearBatch(4, 2, dtype=torch.float64)([]), (0, 2)),
    (lambda: SparseLinearBatch(4, 2, dtype=torch.float64, sparse_grad=True)([]), (0, 2)),
    (lambda: nnsparse.sparse_linear([], torch.ones(2, 4, dtype=torch.float64)), (0, 2)),
    (lambda: SparseCriterion(nn.MSELoss())(torch.zeros(0, 4, dtype=torch.float64), []), ()),
    (lambda: SDAESparseCriterion(nn.MSELoss())(
        torch.zeros(0, 4, dtype=torch.float64), [], mask=torch.zeros(0, 4, dtype=torch.bool)),
     ()),
], ids=["linear", "linear_sparse_grad", "sparse_linear", "sparse_criterion", "sdae_sparse"])
def test_regression_an_empty_list_of_rows_takes_the_callers_width_and_dtype(call, shape):
    out = call()
    assert out.shape == shape and out.dtype == torch.float64
    assert bool((out == 0).all())


def test_regression_an_empty_list_target_still_needs_the_estimates_rows():
    with pytest.raises(ValueError, match=r"target has 0 rows, estimate of shape \(2, 4\) has 2"):
        SparseCriterion(nn.MSELoss())(torch.zeros(2, 4), [])
