"""nnsparse.convert: sparsify, densify, to_pairs, from_pairs against dense references."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, VECTOR_FORMS, make_form, random_sparse_dense
from nnsparse import densify, from_pairs, sparsify, to_pairs

NAN = math.nan


def _unspecified(dense, elem):
    return torch.isnan(dense) if math.isnan(elem) else dense == elem


# -- sparsify ------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("elem", [0, 1, NAN])
def test_sparsify_batch(elem, layout, dtype, device):
    if math.isnan(elem) and dtype == torch.int64:
        pytest.skip("integer tensors hold no NaN")
    dense = random_sparse_dense(6, 5, 0.5, empty_rows=2, device=device)
    dense = (dense * 3).round().to(dtype)
    dense = torch.where(dense == 0, torch.full_like(dense, elem), dense)
    s = sparsify(dense, elem=elem, layout=layout)
    assert s.layout == layout and s.dtype == dtype and s.device == dense.device
    assert s.shape == dense.shape
    keep = ~_unspecified(dense, elem)
    assert s._nnz() == int(keep.sum())
    reference = torch.where(keep, dense, torch.zeros_like(dense))
    torch.testing.assert_close(s.to_dense(), reference)
    if layout == torch.sparse_coo:
        assert s.is_coalesced()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 3])
def test_sparsify_vector_and_offset(offset, device):
    x = torch.tensor([0.0, 1.0, 4.0, 0.0, 0.0, 8.0], device=device)
    s = sparsify(x, offset=offset)
    assert s.shape == (6 + offset,)
    assert s.indices().tolist() == [[1 + offset, 2 + offset, 5 + offset]]
    torch.testing.assert_close(densify(s), torch.cat([x.new_zeros(offset), x]))
    batch = sparsify(torch.stack([x, x.flip(0)]), offset=offset, layout=torch.sparse_csr)
    assert batch.shape == (2, 6 + offset)
    assert batch.col_indices().min().item() >= offset


@pytest.mark.parametrize("elem", [0.0, 2.0, NAN])
def test_sparsify_all_elem_and_empty(elem):
    s = sparsify(torch.full((3, 4), elem), elem=elem)
    assert s._nnz() == 0 and s.shape == (3, 4)
    torch.testing.assert_close(densify(s, elem=elem), torch.full((3, 4), elem), equal_nan=True)
    assert sparsify(torch.zeros(0))._nnz() == 0
    assert sparsify(torch.zeros(0, 3), layout=torch.sparse_csr).shape == (0, 3)


def test_sparsify_nan_elem_keeps_zero():
    x = torch.tensor([NAN, 0.0, NAN, 5.0])
    s = sparsify(x, elem=NAN)
    assert s.indices().tolist() == [[1, 3]]
    assert s.values().tolist() == [0.0, 5.0]


def test_sparsify_gradient_reaches_specified_entries():
    x = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 4.0]], dtype=torch.float64, requires_grad=True)
    s = sparsify(x)
    (s.values() * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]],
                                                    dtype=torch.float64))


@pytest.mark.parametrize("make, error, message", [
    (lambda: sparsify([1.0, 2.0]), TypeError, "x must be a dense tensor, got list"),
    (lambda: sparsify(torch.ones(2).to_sparse()), TypeError, "x must be a dense tensor, got layout"),
    (lambda: sparsify(torch.ones(2, 2, 2)), ValueError, "x must be 1-D .* got 3 dimensions"),
    (lambda: sparsify(torch.ones(())), ValueError, "got 0 dimensions"),
    (lambda: sparsify(torch.ones(2), offset=-1), ValueError, "offset must be a non-negative int, got -1"),
    (lambda: sparsify(torch.ones(2), offset=1.5), TypeError, "offset must be a non-negative int, got 1.5"),
    (lambda: sparsify(torch.ones(2), offset="1"), TypeError, "offset must be a non-negative int, got '1'"),
    (lambda: sparsify(torch.ones(2), offset=True), TypeError, "offset must be a non-negative int, got True"),
    (lambda: sparsify(torch.ones(2), layout=torch.strided), TypeError,
     "layout must be torch.sparse_coo or torch.sparse_csr, got torch.strided"),
    (lambda: sparsify(torch.ones(2), layout=torch.sparse_csr), ValueError,
     "layout torch.sparse_csr needs a 2-D x, got a vector"),
])
def test_sparsify_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


# -- densify ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("elem", [0, -1.0, NAN])
def test_densify_batch(elem, form, dtype, device):
    dense = random_sparse_dense(5, 6, 0.4, empty_rows=2, dtype=dtype, device=device)
    dense[-1, -1] = 1.0  # pair forms infer the width from the largest index
    out = densify(make_form(dense, form), elem=elem)
    reference = torch.where(dense == 0, torch.full_like(dense, elem), dense)
    assert out.dtype == dtype and out.device == dense.device
    torch.testing.assert_close(out, reference, equal_nan=True, **_tol(dtype))


def _tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", VECTOR_FORMS)
def test_densify_vector_and_size(form, device):
    dense = torch.tensor([0.0, 2.0, 0.0, -3.0, 0.0], dtype=torch.float64, device=device)
    x = make_form(dense, form)
    out = densify(x, size=7)
    torch.testing.assert_close(out, torch.cat([dense, dense.new_zeros(2)]))
    torch.testing.assert_close(densify(x, size=(7,)), out)
    with pytest.raises(ValueError, match="size must have at least 4 columns, got 3"
                       if form == "pairs" else "size must have at least 5 columns, got 3"):
        densify(x, size=3)
    with pytest.raises(ValueError, match=r"size of a vector must be an int, got \(1, 7\)"):
        densify(x, size=(1, 7))


@pytest.mark.parametrize("form", BATCH_FORMS)
def test_densify_batch_size(form):
    dense = random_sparse_dense(3, 4, 0.6, empty_rows=1)
    dense[-1, -1] = 1.0
    x = make_form(dense, form)
    out = densify(x, size=(5, 6))
    assert out.shape == (5, 6)
    torch.testing.assert_close(out[:3, :4], dense)
    assert not out[3:].any() and not out[:, 4:].any()
    with pytest.raises(ValueError, match="size must have at least 3 rows, got 2"):
        densify(x, size=(2, 6))
    with pytest.raises(ValueError, match="size must have at least 4 columns, got 3"):
        densify(x, size=(3, 3))
    with pytest.raises(ValueError, match="size of a batch must be a \\(rows, width\\) tuple, got 6"):
        densify(x, size=6)


def test_densify_sums_duplicates():
    x = torch.sparse_coo_tensor([[0, 2, 0, 2]], [1.0, 2.0, 3.0, 4.0], (3,), check_invariants=False)
    torch.testing.assert_close(densify(x), torch.tensor([4.0, 0.0, 6.0]))
    torch.testing.assert_close(densify(x, elem=NAN), torch.tensor([4.0, NAN, 6.0]), equal_nan=True)
    pairs = torch.tensor([[1.0, 2.0], [1.0, 5.0]])
    torch.testing.assert_close(densify(pairs), torch.tensor([0.0, 7.0]))


def test_densify_integer_values():
    x = torch.tensor([[0, 3], [2, 0]]).to_sparse()
    out = densify(x, elem=-1)
    assert out.dtype == torch.int64
    assert out.tolist() == [[-1, 3], [2, -1]]
    with pytest.raises(ValueError, match="elem nan needs floating values, got dtype torch.int64"):
        densify(x, elem=NAN)


@pytest.mark.parametrize("dtype, elem, message", [
    (torch.float16, 1e6, r"elem must fit in the values' dtype torch.float16 \(a finite value in "
                         r"\[-65504.0, 65504.0\], inf or nan\), got 1000000.0"),
    (torch.float16, -65520.0, r"elem must fit in the values' dtype torch.float16"),
    (torch.bfloat16, 1e39, r"elem must fit in the values' dtype torch.bfloat16"),
    (torch.float32, 1e39, r"elem must fit in the values' dtype torch.float32"),
    (torch.bool, 2, r"elem must be stored exactly in the values' dtype torch.bool \(0 or 1\), "
                    r"got 2"),
    (torch.bool, 0.5, r"values' dtype torch.bool \(0 or 1\), got 0.5"),
    (torch.bool, -1, r"values' dtype torch.bool \(0 or 1\), got -1"),
], ids=["float16-1e6", "float16-minus", "bfloat16", "float32", "bool-2", "bool-half", "bool-minus"])
@pytest.mark.parametrize("densify_with", ["function", "module"])
def test_densify_refuses_an_elem_the_dtype_cannot_hold(densify_with, dtype, elem, message):
    import nnsparse
    x = torch.tensor([[1.0, 0.0]]).to(dtype).to_sparse()
    with pytest.raises(ValueError, match=message):
        if densify_with == "function":
            densify(x, elem=elem)
        else:
            nnsparse.Densify(2, elem=elem)(x)


@pytest.mark.parametrize("dtype, elem, expected", [
    (torch.float16, 65504.0, [1.0, 65504.0]),
    (torch.float16, math.inf, [1.0, math.inf]),
    (torch.float16, -math.inf, [1.0, -math.inf]),
    (torch.float16, NAN, [1.0, NAN]),
    (torch.float16, 0.1, [1.0, 0.0999755859375]),  # a float rounds, as torch.full does
    (torch.bool, 1, [True, True]),
    (torch.bool, 0, [True, False]),
    (torch.bool, 1.0, [True, True]),
], ids=["float16-max", "float16-inf", "float16-minus-inf", "float16-nan", "float16-rounds",
        "bool-1", "bool-0", "bool-1.0"])
def test_densify_elem_the_dtype_holds(dtype, elem, expected):
    out = densify(torch.tensor([[1.0, 0.0]]).to(dtype).to_sparse(), elem=elem)
    assert out.dtype == dtype
    torch.testing.assert_close(out[0], torch.tensor(expected, dtype=dtype), equal_nan=True)


def test_densify_empty():
    assert densify(torch.zeros(0, 2)).shape == (0,)
    assert densify(torch.zeros(0, 2), size=4).tolist() == [0.0] * 4
    assert densify([torch.zeros(0, 2), torch.zeros(0, 2)], size=(2, 3)).tolist() == [[0.0] * 3] * 2
    assert densify([], size=(0, 3)).shape == (0, 3)
    with pytest.raises(ValueError, match=r"x is an empty list of rows, which has no width; "
                       r"pass size=\(0, n\), or an empty sparse tensor of the width n"):
        densify([])


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr"])
def test_densify_gradient_reaches_only_specified_values(form):
    dense = random_sparse_dense(3, 5, 0.5, empty_rows=1)
    x = make_form(dense, form)
    values = (x.values() if form == "csr" else x._values()).detach().requires_grad_()
    if form == "csr":
        x = torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), values, x.shape)
    else:
        x = torch.sparse_coo_tensor(x._indices(), values, x.shape, check_invariants=False)
    grad_output = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = densify(x, elem=NAN)
    (out.nan_to_num(0.0) * grad_output).sum().backward()
    index = x.to_sparse_coo()._indices() if form == "csr" else x._indices()
    torch.testing.assert_close(values.grad, grad_output[index[0], index[1]])


def test_densify_gradcheck():
    values = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[0, 1, 1], [2, 0, 2]])
    torch.autograd.gradcheck(
        lambda v: densify(torch.sparse_coo_tensor(index, v, (2, 3), check_invariants=False), elem=0.5),
        (values,))


# Entries drawn mostly from a few values so that elem often occurs in x.
_ENTRY = st.one_of(st.sampled_from([0.0, 1.0, -2.5, NAN, math.inf]), st.floats(width=64))


@settings(max_examples=80)
@given(
    data=st.lists(st.lists(_ENTRY, min_size=3, max_size=3), min_size=1, max_size=5),
    elem=st.one_of(st.sampled_from([0.0, 1.0, NAN]), st.floats(width=64)),
    vector=st.booleans(),
    csr=st.booleans(),
    offset=st.integers(0, 2),
)
def test_property_densify_sparsify_round_trip(data, elem, vector, csr, offset):
    x = torch.tensor(data, dtype=torch.float64)
    if vector:
        x = x[0]
    layout = torch.sparse_csr if csr and not vector else torch.sparse_coo
    s = sparsify(x, elem=elem, layout=layout)
    torch.testing.assert_close(densify(s, elem=elem), x, equal_nan=True, rtol=0, atol=0)
    shifted = densify(sparsify(x, elem=elem, offset=offset), elem=elem)
    torch.testing.assert_close(shifted[..., offset:], x, equal_nan=True, rtol=0, atol=0)


# -- to_pairs / from_pairs ----------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "list"])
def test_to_pairs_batch(form, dtype, device):
    dense = random_sparse_dense(4, 6, 0.5, empty_rows=1, dtype=dtype, device=device)
    pairs = to_pairs(make_form(dense, form))
    assert isinstance(pairs, list) and len(pairs) == 4
    assert pairs[0].shape == (0, 2)
    for row, p in zip(dense, pairs):
        assert p.dtype == dtype and p.device == dense.device
        reference = row.new_zeros(6).index_put((p[:, 0].long(),), p[:, 1], accumulate=True)
        torch.testing.assert_close(reference, row, **_tol(dtype))
    back = from_pairs(pairs, size=6)
    torch.testing.assert_close(back.to_dense(), dense, **_tol(dtype))


def test_to_pairs_vector():
    x = torch.tensor([0.0, 3.0, 0.0, 5.0]).to_sparse()
    torch.testing.assert_close(to_pairs(x), torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    assert to_pairs(torch.zeros(3).to_sparse()).shape == (0, 2)
    values = torch.tensor([3.0, 5.0], requires_grad=True)
    pairs = to_pairs(torch.sparse_coo_tensor([[1, 3]], values, (4,)))
    pairs[:, 1].sum().backward()
    torch.testing.assert_close(values.grad, torch.ones(2))


def test_to_pairs_refuses_inexact_indices():
    x = torch.sparse_coo_tensor([[2 ** 25]], [1.0], (2 ** 25 + 1,))
    with pytest.raises(ValueError, match="cannot be stored exactly as torch.float32"):
        to_pairs(x)
    assert to_pairs(x.double())[0, 0].item() == 2 ** 25


@pytest.mark.parametrize("device", DEVICES)
def test_from_pairs(device):
    pairs = torch.tensor([[1.0, 3.0], [3.0, 5.0], [1.0, 1.0]], device=device)
    x = from_pairs(pairs)
    assert x.shape == (4,) and x.device == pairs.device
    torch.testing.assert_close(x.to_dense(), torch.tensor([0.0, 4.0, 0.0, 5.0], device=device))
    assert from_pairs(pairs, size=9).shape == (9,)
    batch = from_pairs([pairs, pairs[:0], pairs[:1]], size=5)
    assert batch.shape == (3, 5)
    assert batch.to_dense()[1].abs().sum().item() == 0
    int_pairs = from_pairs(torch.tensor([[2, 7]], device=device))
    assert int_pairs.dtype == torch.int64 and int_pairs.to_dense().tolist() == [0, 0, 7]


@pytest.mark.parametrize("make, error, message", [
    (lambda: from_pairs(torch.tensor([[1.0, 2.0]]).to_sparse()), TypeError, "pairs must be a dense"),
    (lambda: from_pairs(torch.ones(2, 3)), ValueError, r"pairs must be a pair tensor of shape \(k, 2\)"),
    (lambda: from_pairs(torch.tensor([[-1.0, 2.0]])), ValueError, "pairs indices must be non-negative"),
    (lambda: from_pairs(torch.tensor([[NAN, 2.0]])), ValueError, "pairs indices must be finite integers"),
    (lambda: from_pairs(torch.tensor([[0.5, 2.0]])), ValueError, "pairs indices must be integers, got 0.5"),
    (lambda: from_pairs(torch.tensor([[3.0, 2.0]]), size=3), ValueError,
     r"pairs indices must be in \[0, 3\), got max 3"),
])
def test_from_pairs_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def _from_pairs_consumers():
    import nnsparse
    from torch import nn
    torch.manual_seed(0)
    linear = nnsparse.SparseLinearBatch(5, 3, dtype=torch.float64)
    weight = torch.randn(5, 3, dtype=torch.float64)
    # the estimate's entries (a sparse estimate must specify every target entry)
    target = torch.tensor([[1.0, 0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 3.0]],
                          dtype=torch.float64).to_sparse()
    criterion = nnsparse.SparseCriterion(nn.MSELoss())
    return [
        ("SparseLinearBatch", linear),
        ("densify", densify),
        ("Densify", nnsparse.Densify(5)),
        ("values_map", lambda x: densify(nnsparse.values_map(torch.tanh, x))),
        ("stopk", lambda x: nnsparse.stopk(x, 1).values),
        ("sparse_mm", lambda x: nnsparse.sparse_mm(x, weight)),
        ("SparseCriterion", lambda x: criterion(x, target)),
    ]


@pytest.mark.parametrize("name, consume", _from_pairs_consumers(),
                         ids=[n for n, _ in _from_pairs_consumers()])
def test_from_pairs_keeps_the_gradient(name, consume):
    # from_pairs gives an uncoalesced COO (repeated index 3 here): its values reach
    # the pairs' values through every consumer, as through x.to_dense()
    def make(values):
        index = torch.tensor([3.0, 0.0, 3.0, 4.0], dtype=torch.float64)
        pairs = torch.stack([index, values], dim=1)
        return from_pairs([pairs[:3], pairs[3:]], size=5)

    values = torch.tensor([1.0, 2.0, -0.5, 4.0], dtype=torch.float64, requires_grad=True)
    x = make(values)
    assert x.requires_grad and not x.is_coalesced()
    consume(x).sum().backward()
    reference = values.detach().clone().requires_grad_()
    consume(make(reference).to_dense().to_sparse()).sum().backward()
    assert values.grad is not None
    torch.testing.assert_close(values.grad, reference.grad)
    torch.autograd.gradcheck(lambda v: consume(make(v)), (values.detach().requires_grad_(),))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparsify_output_is_trusted(layout):
    from nnsparse._forms import _attached, _counts, _reset_counts
    x = sparsify(torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]), layout=layout)
    assert _attached(x) is not None
    _reset_counts()
    assert torch.equal(densify(x), torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]))
    assert _counts().get("validate", 0) == 0


@pytest.mark.parametrize("elem", [
    pytest.param(__import__("numpy").complex64(1 + 1j), id="numpy-complex64"),
    pytest.param(__import__("numpy").complex128(1 + 1j), id="numpy-complex128"),
    pytest.param(1 + 1j, id="python-complex"),
])
def test_a_numpy_complex_elem_keeps_its_imaginary_part(elem):
    """torch reads a numpy complex scalar as its real part: elem is taken as the Python
    number it holds, so 1+1j (not 1+0j) is the entry left out and the one filled in."""
    x = torch.tensor([[1 + 1j, 1 + 0j, 2]])
    s = sparsify(x, elem=elem).coalesce()
    assert s.indices().tolist() == [[0, 0], [1, 2]]
    assert torch.equal(densify(s, elem=elem), x)


@pytest.mark.parametrize("offset", [np.int64(2), np.uint8(2)], ids=["int64", "uint8"])
def test_sparsify_and_Sparsify_take_a_numpy_int_offset(offset):
    """The offset check is _forms.as_count's: numpy ints pass and are kept as Python ints."""
    from nnsparse import Sparsify
    layer = Sparsify(offset=offset)
    assert type(layer.offset) is int and layer.offset == 2
    assert sparsify(torch.ones(3), offset=offset).shape == (5,)


@pytest.mark.parametrize("make, error, message", [
    (lambda: __import__("nnsparse").Sparsify(offset=-1), ValueError,
     "offset must be a non-negative int, got -1"),
    (lambda: __import__("nnsparse").Sparsify(offset=2.0), TypeError,
     "offset must be a non-negative int, got 2.0"),
    (lambda: __import__("nnsparse").Sparsify(offset=2 ** 63), ValueError,
     r"offset must be a non-negative int within int64 \(below 2\*\*63\), got 9223372036854775808"),
    (lambda: sparsify(torch.ones(2), offset=2 ** 63), ValueError,
     r"offset must keep the result's size \(9223372036854775810,\) within int64 elements"),
])
def test_offset_errors(make, error, message):
    with pytest.raises(error, match=f"^{message}"):
        make()
