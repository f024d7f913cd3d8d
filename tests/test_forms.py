"""nnsparse._forms: the one normalisation of every accepted sparse form."""
import math
import re

import pytest
import torch

from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, VECTOR_FORMS, make_form, random_sparse_dense
from nnsparse._forms import (SparseBatch, _a, as_sparse_batch, check_index_range, is_sparse_form,
                             resolve_size)


def _dense_of(batch: SparseBatch) -> torch.Tensor:
    """Dense reference rebuilt from the coordinates (duplicates summed)."""
    out = batch.values.new_zeros(batch.shape)
    return out.index_put((batch.row, batch.col), batch.values, accumulate=True)


def _coo(index, values, size):
    return torch.sparse_coo_tensor(torch.as_tensor(index), torch.as_tensor(values), size,
                                   check_invariants=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.int64])
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_batch_forms(form, dtype, device):
    dense = random_sparse_dense(5, 7, 0.4, empty_rows=2, device=device)
    dense = (dense * 4).round().to(dtype) if dtype == torch.int64 else dense.to(dtype)
    if form == "coo_uncoalesced" and dtype == torch.int64:
        # make_form splits values as 1/4 + 3/4 (floats): split as v + 0 instead
        coo = dense.to_sparse()
        x = _coo(coo.indices().repeat(1, 2), torch.cat([coo.values(), 0 * coo.values()]), dense.shape)
    else:
        x = make_form(dense, form)
    batch = as_sparse_batch(x)
    assert batch.form == form.replace("coo_uncoalesced", "coo")
    assert not batch.is_vector
    assert batch.values.dtype == dtype and batch.device == dense.device
    assert batch.row.dtype == batch.col.dtype == torch.int64
    # pairs know no width: it is the largest index + 1
    width = 7 if form != "pair_list" else int(dense.nonzero()[:, 1].max()) + 1
    assert batch.shape == (5, width)
    torch.testing.assert_close(_dense_of(batch), dense[:, :width])
    coalesced = batch.coalesce()
    assert coalesced.coalesced and coalesced.row_sorted
    assert coalesced.nnz == int((dense != 0).sum())
    torch.testing.assert_close(_dense_of(coalesced), dense[:, :width])
    counts = (dense != 0).sum(1)
    torch.testing.assert_close(coalesced.row_counts(), counts)
    torch.testing.assert_close(coalesced.crow_indices()[1:], counts.cumsum(0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", VECTOR_FORMS)
def test_vector_forms(form, device):
    dense = random_sparse_dense(1, 9, 0.5, device=device)[0]
    dense[-1] = 1.0  # the pair form infers the width from the last index
    batch = as_sparse_batch(make_form(dense, form))
    assert batch.is_vector and batch.shape == (1, 9)
    assert batch.form == ("pairs" if form == "pairs" else "coo")
    torch.testing.assert_close(_dense_of(batch)[0], dense)


@pytest.mark.parametrize("form", BATCH_FORMS)
def test_with_values_rebuilds_the_form(form):
    dense = random_sparse_dense(4, 6, 0.5, empty_rows=1)
    x = make_form(dense, form)
    batch = as_sparse_batch(x, width=6)
    out = batch.with_values(batch.values * 2)
    again = as_sparse_batch(out, width=6)
    assert again.form == batch.form and again.shape == batch.shape
    torch.testing.assert_close(_dense_of(again), 2 * dense)
    keep = batch.values > 0
    kept = as_sparse_batch(batch.with_values(batch.values, keep), width=6)
    torch.testing.assert_close(_dense_of(kept), dense.clamp(min=0))


def test_empty_inputs():
    empty_vector = _coo(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (5,))
    batch = as_sparse_batch(empty_vector)
    assert batch.nnz == 0 and batch.shape == (1, 5) and batch.is_vector
    assert as_sparse_batch(torch.zeros(0, 2)).shape == (1, 0)
    assert as_sparse_batch(torch.tensor([])).nnz == 0  # an empty row given as tensor([])
    batch = as_sparse_batch([], width=3)
    assert batch.shape == (0, 3) and batch.nnz == 0
    batch = as_sparse_batch([torch.zeros(0, 2), torch.tensor([[2.0, 1.0]])])
    assert batch.shape == (2, 3) and batch.row.tolist() == [1]
    batch = as_sparse_batch(torch.zeros(3, 4).to_sparse_csr())
    assert batch.shape == (3, 4) and batch.nnz == 0


def test_width_argument():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert as_sparse_batch(x, width=10).shape == (1, 10)
    with pytest.raises(ValueError, match=r"input indices must be in \[0, 3\), got max 3"):
        as_sparse_batch(x, width=3)
    with pytest.raises(ValueError, match="x has width 6, larger than the size asked for, 4$"):
        as_sparse_batch(torch.zeros(6).to_sparse(), name="x", width=4)
    with pytest.raises(ValueError, match="x has width 6, larger than in_features 4$"):
        as_sparse_batch(torch.zeros(2, 6).to_sparse_csr(), name="x", width=4, bound="in_features")


def test_uncoalesced_with_grad_keeps_the_graph():
    values = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = _coo([[0, 2, 0]], values, (4,))
    batch = as_sparse_batch(x)
    assert batch.coalesced
    _dense_of(batch).sum().backward()
    torch.testing.assert_close(values.grad, torch.ones(3))


@pytest.mark.parametrize("rows", [
    [torch.tensor([[1.0, 3.0]]), torch.zeros(0, 2, dtype=torch.float64)],
    [torch.zeros(0, 2, dtype=torch.float64), torch.tensor([[1.0, 3.0]])],
    [torch.tensor([0.0, 3.0]).to_sparse(), torch.zeros(2, dtype=torch.float64).to_sparse()],
], ids=["pairs", "pairs-empty-first", "sparse-vectors"])
def test_an_empty_row_does_not_promote_the_batch(rows):
    batch = as_sparse_batch(rows)
    assert batch.dtype == torch.float32 and batch.values.dtype == torch.float32


def test_rows_with_entries_must_share_one_dtype():
    with pytest.raises(TypeError, match=r"x rows must share one dtype, got \['torch.float32', "
                                        r"'torch.float64'\]"):
        as_sparse_batch([torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]]).double()],
                        name="x")


def test_is_sparse_form():
    assert is_sparse_form(torch.zeros(2).to_sparse())
    assert is_sparse_form([torch.zeros(1, 2)])
    assert not is_sparse_form(torch.zeros(2))
    assert not is_sparse_form(3)


def test_check_index_range_and_resolve_size():
    assert check_index_range(torch.tensor([0, 4, 2]), 5, "i") == 5
    assert check_index_range(torch.zeros(0, dtype=torch.int64), 0, "i") == 0
    with pytest.raises(ValueError, match=r"i must be in \[0, 4\), got max 4"):
        check_index_range(torch.tensor([0, 4]), 4, "i")
    with pytest.raises(ValueError, match="i must be non-negative, got min -2"):
        check_index_range(torch.tensor([-2, 1]), None, "i")
    batch = as_sparse_batch(torch.eye(3).to_sparse())
    assert resolve_size(None, batch) == (3, 3)
    assert resolve_size((4, 5), batch) == (4, 5)
    with pytest.raises(ValueError, match="size must have at least 3 rows, got 2"):
        resolve_size((2, 5), batch)
    with pytest.raises(ValueError, match="size must have at least 3 columns, got 1"):
        resolve_size((3, 1), batch)


BAD_INPUTS = [
    # (input, exception, message)
    (lambda: _coo([[0, -1]], [1.0, 2.0], (4,)), ValueError, "x indices must be non-negative, got min -1"),
    (lambda: _coo([[0, 4]], [1.0, 2.0], (4,)), ValueError, r"x indices must be in \[0, 4\), got max 4"),
    (lambda: _coo([[0, 3], [1, 5]], [1.0, 2.0], (4, 5)), ValueError,
     r"x column indices must be in \[0, 5\), got max 5"),
    (lambda: _coo([[0, 4], [1, 2]], [1.0, 2.0], (4, 5)), ValueError,
     r"x row indices must be in \[0, 4\), got max 4"),
    (lambda: torch.tensor([[1.5, 1.0]]), ValueError, "x indices must be integers, got 1.5"),
    (lambda: torch.tensor([[math.nan, 1.0]]), ValueError, "x indices must be finite integers, got nan"),
    (lambda: torch.tensor([[math.inf, 1.0]]), ValueError, "x indices must be finite integers, got inf"),
    (lambda: torch.tensor([[-1.0, 1.0]]), ValueError, "x indices must be non-negative, got min -1"),
    (lambda: torch.tensor([[True, False]]), TypeError, "x indices must be real numbers, got dtype torch.bool"),
    (lambda: torch.ones(3, 3), ValueError, r"x must be a pair tensor of shape \(k, 2\), got shape \(3, 3\)"),
    (lambda: torch.ones(3), ValueError, r"x must be a pair tensor of shape \(k, 2\), got shape \(3,\)"),
    (lambda: torch.ones(2, 2, 2), ValueError, r"pair tensor of shape \(k, 2\), got shape \(2, 2, 2\)"),
    (lambda: torch.ones(2, 2, 2).to_sparse(), ValueError,
     "x must be a sparse vector or a 2-D sparse batch, got 3 dimensions"),
    (lambda: torch.ones(2, 3).to_sparse(1), NotImplementedError,
     "x: hybrid sparse tensors are not supported, got dense_dim 1"),
    (lambda: torch.eye(3).to_sparse_csc(), NotImplementedError, "x: layout torch.sparse_csc is not supported"),
    (lambda: [], ValueError,
     "x is an empty list of rows, which has no width; pass instead an empty sparse tensor of "
     "the width n"),
    (lambda: [torch.zeros(3).to_sparse(), torch.zeros(1, 2)], TypeError,
     "x mixes sparse vectors and pair tensors; use one form per batch"),
    (lambda: [torch.zeros(3).to_sparse(), torch.zeros(4).to_sparse()], ValueError,
     r"x rows must share one size, got \[3, 4\]"),
    (lambda: [torch.eye(2).to_sparse()], ValueError, r"x rows must be 1-D sparse vectors, got shapes \[\(2, 2\)\]"),
    (lambda: [torch.zeros(1, 2), [1, 2]], TypeError, r"x\[1\] must be a tensor, got list"),
    (lambda: [torch.zeros(1, 2), torch.zeros(1, 2, device="meta")], ValueError,
     r"x rows must be on one device, got \['cpu', 'meta'\]"),
    (lambda: [torch.tensor([[0.0, 1.0]]), torch.tensor([[2.5, 1.0]])], ValueError,
     r"x\[1\] indices must be integers, got 2.5"),
    (lambda: 3.0, TypeError, "x must be a sparse tensor, a pair tensor or a list of sparse rows, got float"),
]


@pytest.mark.parametrize("make, error, message", BAD_INPUTS,
                         ids=[f"bad{i}" for i in range(len(BAD_INPUTS))])
def test_bad_inputs(make, error, message):
    with pytest.raises(error, match=message):
        as_sparse_batch(make(), name="x")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_mixed_cuda_and_cpu_rows():
    rows = [torch.zeros(3).to_sparse(), torch.zeros(3, device="cuda").to_sparse()]
    with pytest.raises(ValueError, match="x rows must be on one device"):
        as_sparse_batch(rows, name="x")


def test_csr_with_int32_indices():
    dense = random_sparse_dense(4, 5, 0.5, empty_rows=1)
    csr = dense.to_sparse_csr()
    csr = torch.sparse_csr_tensor(csr.crow_indices().int(), csr.col_indices().int(), csr.values(), csr.shape)
    batch = as_sparse_batch(csr)
    assert batch.row.dtype == batch.col.dtype == torch.int64
    torch.testing.assert_close(_dense_of(batch), dense)


# _a: the article of a name built into a message ("holds an AutoRec", not "holds a AutoRec")
@pytest.mark.parametrize("word, expected", [
    ("AutoRec", "an AutoRec"), ("CFN", "a CFN"), ("KernelNet", "a KernelNet"),
    ("RatingModel", "a RatingModel"), ("Ratings", "a Ratings"), ("int", "an int"),
    ("list", "a list"), ("tuple", "a tuple"), ("Embedding", "an Embedding"),
    ("MSELoss", "an MSELoss"), ("SDAECriterion", "an SDAECriterion"), ("nn.Module", "an nn.Module"),
    ("UnknownModel", "an UnknownModel"), ("UserModel", "a UserModel"), ("OneHot", "a OneHot"),
    ("'adam'", "an 'adam'"), ("'sgd'", "an 'sgd'"), ("'rowwise_adagrad'", "a 'rowwise_adagrad'"),
    ("torch.float32", "a torch.float32"), ("X", "an X"), ("U", "a U"),
    ("2", "a 2"), ("8", "an 8"), ("11", "an 11"), ("18", "an 18"), ("80", "an 80"),
    ("110", "a 110"), ("18000", "an 18000"), ("", "a "),
])
def test_article(word, expected):
    assert _a(word) == expected


# as_count: another kind than an int is a TypeError, an int out of range a ValueError
@pytest.mark.parametrize("value, error, message", [
    ("a", TypeError, "batch_size must be an int >= 1, got 'a'"),
    (2.0, TypeError, "batch_size must be an int >= 1, got 2.0"),
    (True, TypeError, "batch_size must be an int >= 1, got True"),
    (None, TypeError, "batch_size must be an int >= 1, got None"),
    (0, ValueError, "batch_size must be an int >= 1, got 0"),
    (2 ** 63, ValueError, r"batch_size must be an int >= 1 "
                          r"within int64 \(below 2\*\*63\), got 9223372036854775808"),
])
def test_as_count_errors(value, error, message):
    from nnsparse._forms import as_count
    with pytest.raises(error, match=f"^{message}$"):
        as_count("batch_size", value, 1)


def test_as_count_takes_numpy_ints():
    import numpy as np
    from nnsparse._forms import as_count
    assert as_count("k", np.int64(3), 0) == 3 and type(as_count("k", np.int64(3), 0)) is int


# as_count(must=...): the bound in words, for the arguments that always said so
@pytest.mark.parametrize("low, must, value, error, message", [
    (1, "positive", 0, ValueError, "n must be a positive int, got 0"),
    (1, "positive", "2", TypeError, "n must be a positive int, got '2'"),
    (1, "positive", 2.0, TypeError, "n must be a positive int, got 2.0"),
    (1, "positive", 2 ** 63, ValueError,
     r"n must be a positive int within int64 \(below 2\*\*63\), got 9223372036854775808"),
    (0, "non-negative", -1, ValueError, "n must be a non-negative int, got -1"),
    (0, "non-negative", False, TypeError, "n must be a non-negative int, got False"),
    (0, "non-negative", 2 ** 64, ValueError,
     r"n must be a non-negative int within int64 \(below 2\*\*63\), got 18446744073709551616"),
])
def test_as_count_worded_errors(low, must, value, error, message):
    from nnsparse._forms import as_count
    with pytest.raises(error, match=f"^{message}$"):
        as_count("n", value, low, must=must)


@pytest.mark.parametrize("low, must", [(0, "positive"), (1, "non-negative"), (2, "positive"),
                                       (1, "big")])
def test_as_count_refuses_words_that_misstate_the_bound(low, must):
    from nnsparse._forms import as_count
    with pytest.raises(ValueError, match=f"^must={must!r} does not word the bound low={low}$"):
        as_count("n", 3, low, must=must)


def test_as_count_worded_takes_the_bound_and_int64_max():
    import numpy as np
    from nnsparse._forms import as_count
    assert as_count("n", 0, 0, must="non-negative") == 0
    assert as_count("n", np.uint8(1), 1, must="positive") == 1
    assert as_count("n", 2 ** 63 - 1, 1, must="positive") == 2 ** 63 - 1


@pytest.mark.parametrize("x, expected", [
    ([torch.tensor([[0.0, 1.0]]), torch.zeros(0, 2)], True),  # Lua pair rows
    ((torch.tensor([[2.0, 1.0]]),), True),
    ([], False),  # no row: no form at all
    ([torch.tensor([[0.0, 1.0]]), torch.tensor([1.0, 0.0]).to_sparse()], False),  # mixed
    ([torch.tensor([1.0, 0.0]).to_sparse()], False),  # sparse vectors
    (torch.tensor([[0.0, 1.0]]), False),  # one pair tensor, not a list
    ([[0.0, 1.0]], False),  # numbers, not tensors
])
def test_is_pair_list(x, expected):
    # the one test of Lua pair rows that sparse_mm and the criteria read a width for
    from nnsparse._forms import is_pair_list
    assert is_pair_list(x) is expected


def _layers_in_inference_mode():
    """(name, make, call) of layers whose backward saves the input's or pattern's indices."""
    import nnsparse
    h = torch.randn(3, 3)
    return [
        ("SparseLinearBatch-sparse_grad", lambda: nnsparse.SparseLinearBatch(4, 3, sparse_grad=True),
         lambda m, x: m(x)),
        ("SparseOutputLinear", lambda: nnsparse.SparseOutputLinear(3, 4), lambda m, x: m(h, x)),
        ("SparseOutputLinear-sparse_grad", lambda: nnsparse.SparseOutputLinear(3, 4, sparse_grad=True),
         lambda m, x: m(h, x)),
    ]


@pytest.mark.parametrize("first", ["whole", "lazy"])
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo], ids=["csr", "coo"])
@pytest.mark.parametrize("case", _layers_in_inference_mode(), ids=lambda c: c[0])
def test_an_ordinary_tensor_read_under_inference_mode_then_trains(case, layout, first):
    """A user's ordinary tensor read by a layer under ``torch.inference_mode()`` (an
    evaluation pass), then trained on, gives the outputs and gradients of a tensor never
    read in that mode: the structures nnsparse built there (inference tensors, which
    autograd cannot save: "Inference tensors cannot be saved for backward") are built
    again outside it.  ``first``: the whole structure was built in the mode ("whole"), or
    only the cached ones a layer built lazily there ("lazy", the structure attached by a
    training step before)."""
    import copy

    import nnsparse
    _, make, call = case
    dense = torch.tensor([[0., 1., 0., 2.], [3., 0., 0., 0.], [0., 0., 4., 5.]])

    def form():
        return dense.to_sparse_csr() if layout == torch.sparse_csr else dense.to_sparse()

    torch.manual_seed(0)
    layer = make()
    twin = copy.deepcopy(layer)
    x = form()
    if first == "lazy":
        nnsparse.SparseLinearBatch(4, 3)(x).sum().backward()
    with torch.inference_mode():
        call(twin, x)
    results = []
    for module, data in ((twin, x), (layer, form())):
        out = call(module, data)
        total = nnsparse.densify(out) if out.layout != torch.strided else out
        grads = torch.autograd.grad(total.square().sum(), list(module.parameters()))
        # (a sparse_grad layer's weight gradient is row-sparse, a hybrid COO tensor)
        results.append([g.to_dense() if g.layout != torch.strided else g
                        for g in (total, *grads)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


# int64_message: the one wording of an integer beyond int64 (check_int64 and as_count raise it)
@pytest.mark.parametrize("args, message", [
    (("k", 2 ** 63), "k must be an int within int64 (below 2**63), got 9223372036854775808"),
    (("elem", -2 ** 63 - 1, "an int"),
     "elem must be an int within int64 (at least -2**63), got -9223372036854775809"),
    (("size", 2 ** 64, "a non-negative int"),
     "size must be a non-negative int within int64 (below 2**63), got 18446744073709551616"),
    (("indices", 2 ** 63, "ints", "a uint64 entry >= 2**63"),
     "indices must be ints within int64 (below 2**63), got a uint64 entry >= 2**63"),
])
def test_int64_message(args, message):
    from nnsparse._forms import int64_message
    assert int64_message(*args) == message


# check_numel: the one wording of an element count beyond int64 (the builder, from_pairs,
# rating_matrix)
@pytest.mark.parametrize("args, message", [
    (((2 ** 62, 2), "size"), "size must have at most 2**63 - 1 elements (torch counts them in "
                             "int64), got (4611686018427387904, 2)"),
    (((3, 2 ** 62), "pairs", "a batch of size (3, 4611686018427387904)"),
     "pairs must have at most 2**63 - 1 elements (torch counts them in int64), got a batch of "
     "size (3, 4611686018427387904)"),
])
def test_check_numel(args, message):
    from nnsparse._forms import check_numel
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_numel(*args)
    assert check_numel([2 ** 62, 1], "size") == (2 ** 62, 1)  # a list: a tuple of ints
    assert check_numel((2 ** 31, 2 ** 31, 2 ** 0), "size") == (2 ** 31, 2 ** 31, 1)  # 2**62
    assert check_numel((), "size") == ()
    # torch multiplies the sizes in turn in uint64: past 2**64 it overflows, a 0 after too
    big = (2 ** 40, 2 ** 40, 0)
    with pytest.raises(RuntimeError, match="numel: integer multiplication overflow"):
        torch.sparse_coo_tensor(torch.zeros(3, 0, dtype=torch.long), torch.zeros(0), big)
    with pytest.raises(ValueError, match=re.escape(
            "size must keep the product of its first sizes below 2**64 (torch multiplies them "
            "in turn, a 0 after them included), got (1099511627776, 1099511627776, 0)")):
        check_numel(big, "size")
    assert check_numel((0, 2 ** 40, 2 ** 40), "size") == (0, 2 ** 40, 2 ** 40)  # torch's too
    torch.sparse_coo_tensor(torch.zeros(3, 0, dtype=torch.long), torch.zeros(0), (0, 2 ** 40, 2 ** 40))


@pytest.mark.parametrize("value, expected, message", [
    (2 ** 63, (), "k must be an int within int64 (below 2**63), got 9223372036854775808"),
    (2 ** 70, ("a non-negative int",),
     "k must be a non-negative int within int64 (below 2**63), got 1180591620717411303424"),
])
def test_check_int64(value, expected, message):
    from nnsparse._forms import check_int64
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_int64(value, "k", *expected)
    assert check_int64(2 ** 63 - 1, "k", *expected) == 2 ** 63 - 1


def test_as_tensor_copies_numpy_arrays_with_negative_strides_only():
    import numpy as np
    from nnsparse._forms import as_tensor
    a = np.arange(6).reshape(2, 3)
    for view in (np.flip(a), a[::-1], a[:, ::-2], np.flip(a)[::-1]):
        out = as_tensor(view)
        assert out.tolist() == view.tolist()
        assert not np.shares_memory(out.numpy(), a)
    shared = as_tensor(a[:, ::2])  # positive strides: shared, as torch.as_tensor shares them
    assert np.shares_memory(shared.numpy(), a) and shared.tolist() == a[:, ::2].tolist()
    with pytest.raises(ValueError, match="negative"):
        torch.as_tensor(np.flip(a))  # (what as_tensor goes round)


# _forms.int_dtype: the integer dtypes (signed and unsigned) and nothing else; the 0-d
# integer tensors int_of_0d reads, the others passed on as they came
@pytest.mark.parametrize("dtype, integer", [
    (torch.uint8, True), (torch.int8, True), (torch.int16, True), (torch.int32, True),
    (torch.int64, True), (torch.uint16, True), (torch.uint32, True), (torch.uint64, True),
    (torch.bool, False), (torch.float16, False), (torch.bfloat16, False),
    (torch.float32, False), (torch.float64, False), (torch.complex64, False),
    (torch.complex128, False)])
def test_int_dtype(dtype, integer):
    from nnsparse._forms import int_dtype, int_of_0d
    assert int_dtype(dtype) is integer
    value = torch.ones((), dtype=dtype)
    assert (int_of_0d(value, "n") == 1 and type(int_of_0d(value, "n")) is int) if integer \
        else int_of_0d(value, "n") is value
