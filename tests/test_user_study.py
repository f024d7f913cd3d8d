"""The user study (docs/user_study.md): a recommender-systems researcher's own model.

``nnsparse.data.ranking_metrics`` scores the top-k lists of a network that is not a model of
``nnsparse.models`` (before, ``evaluate_ranking`` was the only way to the figures, and only
for the model zoo), checked against a per-user Python reference and against
``evaluate_ranking`` itself; ``SparseRowDataset`` given a ``Ratings`` says how to make its
matrix.
"""
import math

import pytest
import torch

import nnsparse
from nnsparse.data import (RatingNormalizer, Ratings, SparseRowDataset, rating_matrix,
                           ranking_metrics, split_ratings, synthetic_ratings)
from nnsparse.models import AutoRec

from probe_cases import Case, run_case


def _reference(lists, test, k, threshold=None):
    """The figures by their definitions, user by user, in plain Python."""
    relevant = {}
    for u, i, r in zip(test.user.tolist(), test.item.tolist(), test.rating.tolist()):
        if threshold is None or r >= threshold:
            relevant.setdefault(u, set()).add(i)
    p = r_ = n = h = 0.0
    for u, rel in relevant.items():
        hits = [j < k and item in rel for j, item in enumerate(lists[u])]
        dcg = sum(1 / math.log2(j + 2) for j, hit in enumerate(hits) if hit)
        ideal = sum(1 / math.log2(j + 2) for j in range(min(k, len(rel))))
        p += sum(hits) / k
        r_ += sum(hits) / len(rel)
        n += dcg / ideal
        h += float(any(hits))
    m = len(relevant)
    return {f"precision@{k}": p / m, f"recall@{k}": r_ / m, f"ndcg@{k}": n / m,
            f"hit_rate@{k}": h / m, "users": m}


def _test_ratings():
    # users 0..4 (user 3 has no test rating), items 0..7, ids equal to indices
    user = [0, 0, 0, 1, 2, 2, 4, 4, 4, 4]
    item = [0, 1, 2, 3, 4, 0, 5, 6, 7, 1]
    rating = [5., 2., 4., 3., 1., 5., 4., 4., 2., 5.]
    # user 3 rates only in the last triple, which subset() drops: ids map to themselves
    return Ratings.from_triples(user + [3], item + [0], rating + [1.]).subset(torch.arange(10))


def _close(expected):
    def check(got):
        return got.keys() == expected.keys() and all(
            math.isclose(got[key], value, rel_tol=1e-12, abs_tol=1e-12)
            for key, value in expected.items())
    return check


def _lists():
    torch.manual_seed(0)
    return torch.rand(5, 8).argsort(dim=1)  # each user's items in a random order


def test_identity_maps():
    test = _test_ratings()
    assert test.user_map == {u: u for u in range(5)} and test.item_map == {i: i for i in range(8)}
    assert len(test) == 10 and test.n_items == 8


_T = _test_ratings
_L = _lists

GOOD = [
    Case("indices", lambda: ranking_metrics(_L()[:, :4], _T()), None,
         check=lambda got: _close(_reference(_L()[:, :4].tolist(), _T(), 4))(got)),
    Case("k-below-columns", lambda: ranking_metrics(_L(), _T(), 3), None,
         check=lambda got: _close(_reference(_L().tolist(), _T(), 3))(got)),
    Case("k-above-columns", lambda: ranking_metrics(_L()[:, :2], _T(), 5), None,
         check=lambda got: _close(_reference(_L()[:, :2].tolist(), _T(), 5))(got)),
    Case("threshold", lambda: ranking_metrics(_L()[:, :4], _T(), threshold=4.0), None,
         check=lambda got: _close(_reference(_L()[:, :4].tolist(), _T(), 4, 4.0))(got)),
    Case("torch-topk", lambda: ranking_metrics(torch.rand(5, 8, generator=torch.Generator()
                                                          .manual_seed(1)).topk(3, dim=1), _T()),
         None, check=lambda got: _close(_reference(
             torch.rand(5, 8, generator=torch.Generator().manual_seed(1)).topk(3, dim=1)
             .indices.tolist(), _T(), 3))(got)),
    # stopk's padding (index -1) and Batchifier.topk's (-inf values) are misses
    Case("negative-index-padding", lambda: ranking_metrics(
        torch.tensor([[0, -1, -1]] + [[1, 2, 3]] * 4), _T()), None,
         check=lambda got: _close(_reference([[0]] + [[1, 2, 3]] * 4, _T(), 3))(got)),
    Case("minus-inf-padding", lambda: ranking_metrics(torch.return_types.topk((
        torch.tensor([[1., -math.inf, math.nan]] + [[3., 2., 1.]] * 4),
        torch.tensor([[0, 1, 2]] + [[1, 2, 3]] * 4))), _T()), None,
         check=lambda got: _close(_reference([[0]] + [[1, 2, 3]] * 4, _T(), 3))(got)),
    Case("stopk-result", lambda: ranking_metrics(nnsparse.stopk(
        torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.]] + [[0., 1., 2., 0.]] * 3)
        .to_sparse(), 3), _T()), None,
         check=lambda got: _close(_reference([[1, 3], [0], [2, 1], [2, 1], [2, 1]], _T(), 3))(got)),
    Case("more-rows-than-users", lambda: ranking_metrics(torch.cat([_L(), _L()])[:, :4], _T()),
         None, check=lambda got: _close(_reference(_L()[:, :4].tolist(), _T(), 4))(got)),
]

BAD = [
    Case("scores-not-indices", lambda: ranking_metrics(torch.rand(5, 8), _T()), TypeError,
         r"top must hold integer item indices, got dtype torch\.float32; pass torch\.topk's "
         r"result"),
    Case("bool", lambda: ranking_metrics(torch.ones(5, 3, dtype=torch.bool), _T()), TypeError,
         r"integer item indices, got dtype torch\.bool"),
    Case("list", lambda: ranking_metrics([[0, 1]] * 5, _T()), TypeError,
         r"top must be a dense integer tensor .* got list"),
    Case("sparse", lambda: ranking_metrics(torch.ones(5, 3).long().to_sparse(), _T()),
         TypeError, r"top must be a dense integer tensor .* got layout torch\.sparse_coo"),
    Case("1-d", lambda: ranking_metrics(torch.arange(5), _T()), ValueError,
         r"top must be 2-D \(users, k\), got shape \(5,\)"),
    Case("too-few-rows", lambda: ranking_metrics(_L()[:4], _T()), ValueError,
         r"top must have a row for every test user .* at least 5 rows, got 4"),
    Case("item-out-of-range", lambda: ranking_metrics(torch.full((5, 2), 8), _T()), ValueError,
         r"top's item indices must be below test\.n_items 8 .* got 8"),
    Case("item-twice", lambda: ranking_metrics(torch.tensor([[0, 1]] * 4 + [[6, 6]]), _T()),
         ValueError, r"top must list an item once a row: user 4's list holds item 6 twice"),
    Case("values-int", lambda: ranking_metrics(torch.return_types.topk((
        torch.ones(5, 2, dtype=torch.long), _L()[:, :2])), _T()), TypeError,
         r"top's values must be floating point, got dtype torch\.int64"),
    Case("values-shape", lambda: ranking_metrics(torch.return_types.topk((
        torch.ones(5, 3), _L()[:, :2])), _T()), ValueError,
         r"top's values must have its indices' shape \(5, 2\), got \(5, 3\)"),
    Case("values-sparse", lambda: ranking_metrics(torch.return_types.topk((
        torch.ones(5, 2).to_sparse(), _L()[:, :2])), _T()), TypeError,
         r"^top's values must be a dense tensor, got layout torch\.sparse_coo$"),
    # (meta stands in for another device: values on CUDA beside CPU indices)
    Case("values-other-device", lambda: ranking_metrics(torch.return_types.topk((
        torch.ones(5, 2, device="meta"), _L()[:, :2])), _T()), ValueError,
         r"^top's values must be on its indices' device cpu, got meta$"),
    Case("top-meta", lambda: ranking_metrics(_L().to("meta"), _T()), ValueError,
         r"^top must hold data, got a tensor on the meta device"),
    Case("test-not-ratings", lambda: ranking_metrics(_L(), torch.ones(3)), TypeError, r"test"),
    Case("k-zero", lambda: ranking_metrics(_L(), _T(), 0), ValueError, r"k must be"),
    Case("k-float", lambda: ranking_metrics(_L(), _T(), 2.5), TypeError, r"k must be"),
    Case("no-columns", lambda: ranking_metrics(_L()[:, :0], _T()), ValueError,
         r"k must be positive, got top with 0 columns and no k"),
    Case("threshold-nan", lambda: ranking_metrics(_L(), _T(), threshold=math.nan), ValueError,
         r"threshold must be finite"),
    Case("threshold-too-high", lambda: ranking_metrics(_L(), _T(), threshold=6.0), ValueError,
         r"test holds no relevant rating: none of its 10 ratings is >= threshold 6 \(the "
         r"highest is 5\)"),
    Case("empty-test", lambda: ranking_metrics(_L(), _T().subset(torch.arange(0))), ValueError,
         r"test holds no ratings"),
    # a pair twice would count twice in recall's denominator (recall 2/3 for a perfect list)
    Case("test-pair-twice", lambda: ranking_metrics(torch.tensor([[0, 1]]), Ratings.from_triples(
        [0, 0, 0], [0, 1, 1], [5., 3., 3.])), ValueError,
         r"^test: 1 \(user, item\) pair rated more than once, e\.g\. user 0 and item 1 "
         r"\(2 ratings\); keep one rating per pair$"),
]


@pytest.mark.parametrize("case", GOOD + BAD, ids=lambda c: c.id)
def test_ranking_metrics(case):
    run_case(case)


def test_ranking_metrics_equals_evaluate_ranking():
    """The figures of a model zoo model's own lists, rebuilt from ``predict_entries``'s whole
    score matrix by ``torch.topk`` the way a user would, equal ``evaluate_ranking``'s."""
    train, test = split_ratings(synthetic_ratings(0, 60, 50, 1200), 0.2, seed=0)
    model = AutoRec(hidden=8, epochs=2, validation_ratio=0.0).fit(train, verbose=False,
                                                                 progress=False)
    for k, threshold in [(5, None), (10, 4.0), (60, None)]:
        expected = model.evaluate_ranking(test, k, threshold=threshold, progress=False)
        users, items = torch.meshgrid(torch.arange(train.n_users), torch.arange(train.n_items),
                                      indexing="ij")
        with torch.no_grad():
            scores = model.predict_entries(users.reshape(-1), items.reshape(-1))
        scores = scores.reshape(train.n_users, train.n_items)
        scores[train.user, train.item] = -math.inf
        order = scores.argsort(dim=1, descending=True, stable=True)[:, :k]  # ties: smaller index
        got = ranking_metrics(torch.return_types.topk((scores.gather(1, order), order)), test,
                              k, threshold=threshold)
        assert got == pytest.approx(expected, rel=1e-12), (k, threshold)


_R = synthetic_ratings(0, 6, 5, 20)


@pytest.mark.parametrize("case", [
    Case("input", lambda: SparseRowDataset(_R), TypeError,
         r"input must be a 2-D sparse CSR or COO tensor, got Ratings; ratings become a matrix "
         r"with RatingNormalizer\(train\)\.matrix\(ratings\) .* or rating_matrix\(ratings\)"),
    Case("target", lambda: SparseRowDataset(rating_matrix(_R), _R), TypeError,
         r"target must be a 2-D sparse CSR or COO tensor or a dense tensor of labels, got "
         r"Ratings; ratings become"),
    Case("the-hint-works", lambda: len(SparseRowDataset(RatingNormalizer(_R).matrix(_R))), None,
         check=lambda n: n == _R.n_items),
], ids=lambda c: c.id)
def test_dataset_of_ratings(case):
    run_case(case)


# -- the function forms under autocast take what their layers take (as F.linear / nn.Linear)

def _amp_pair(layout):
    torch.manual_seed(0)
    x = torch.tensor([[0., 3., 0., 1., 0.], [2., 0., 0., 0., 0.], [0., 0., 0., 0., 0.]])
    x = x.to_sparse_csr() if layout == "csr" else x.to_sparse()
    return x.to(torch.bfloat16), nnsparse.SparseLinearBatch(5, 3, mode="sparse")


@pytest.mark.parametrize("layout", ["csr", "coo"])
def test_sparse_linear_under_autocast(layout):
    x, layer = _amp_pair(layout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        got = nnsparse.sparse_linear(x, layer.weight, layer.bias, mode="sparse")
    reference = nnsparse.sparse_linear(x.float(), layer.weight, layer.bias, mode="sparse")
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    torch.testing.assert_close(got, reference)  # the product read in the weight's dtype
    got.sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_sampled_linear_under_autocast():
    torch.manual_seed(0)
    pattern = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.]]).to_sparse_csr()
    layer = nnsparse.SparseOutputLinear(3, 4)
    h = torch.randn(2, 3, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(h, pattern)
        got = nnsparse.sampled_linear(h, layer.weight, layer.bias, pattern)
    assert got.dtype == torch.float32 and torch.equal(got.values(), expected.values())
    reference = nnsparse.sampled_linear(h.detach().float(), layer.weight, layer.bias, pattern)
    torch.testing.assert_close(got.values(), reference.values())
    got.values().sum().backward()
    assert h.grad is not None and h.grad.dtype == torch.bfloat16


def _dense_rows(dtype):
    return torch.tensor([[1., 0., 2.]]).to(dtype)


_PATTERN = torch.tensor([[1., 0.]]).to_sparse()


def _autocast(run):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return run()


@pytest.mark.parametrize("case", [
    Case("sparse-int64", lambda: nnsparse.SparseLinearBatch(3, 2)(
        _dense_rows(torch.int64).to_sparse()), ValueError,
         r"input must have the weight's dtype torch\.float32, got torch\.int64; convert the "
         r"input \(x\.to\(torch\.float32\)\)$"),
    Case("sparse-float64", lambda: nnsparse.SparseLinearBatch(3, 2)(
        _dense_rows(torch.float64).to_sparse_csr()), ValueError,
         r"got torch\.float64; convert the input \(x\.to\(torch\.float32\)\) or the layer "
         r"\(\.to\(torch\.float64\)\)$"),
    Case("sparse-bfloat16", lambda: nnsparse.SparseLinearBatch(3, 2)(
        _dense_rows(torch.bfloat16).to_sparse()), ValueError,
         r"got torch\.bfloat16; convert the input \(x\.to\(torch\.float32\)\) or the layer "
         r"\(\.to\(torch\.bfloat16\)\), or run the forward under torch\.autocast"),
    Case("dense-float16", lambda: nnsparse.SparseLinearBatch(3, 2)(_dense_rows(torch.float16)),
         ValueError, r"got torch\.float16; convert the input .* or run the forward under "
         r"torch\.autocast"),
    Case("function-form", lambda: nnsparse.sparse_linear(
        _dense_rows(torch.float16).to_sparse(), torch.ones(2, 3)), ValueError,
         r"got torch\.float16; convert the input"),
    Case("sampled-bfloat16", lambda: nnsparse.sampled_linear(
        _dense_rows(torch.bfloat16), torch.ones(2, 3), None, _PATTERN), ValueError,
         r"^weight must have input's dtype torch\.bfloat16, got torch\.float32; convert the input "
         r"\(x\.to\(torch\.float32\)\) or the layer \(\.to\(torch\.bfloat16\)\), or run the "
         r"forward under torch\.autocast, which reads it in the weight's dtype$"),
    # autocast casts floating tensors only: an integer input stays refused, as by F.linear
    Case("sampled-int64-under-autocast", lambda: _autocast(lambda: nnsparse.sampled_linear(
        _dense_rows(torch.int64), torch.ones(2, 3), None, _PATTERN)), ValueError,
         r"^weight must have input's dtype torch\.int64, got torch\.float32; convert the input "
         r"\(x\.to\(torch\.float32\)\)$"),
    # the SparseParts path (torch.compile's; checked in eager too) says the same
    Case("parts-encoder-float64", lambda: nnsparse.SparseLinearBatch(3, 2)(
        nnsparse.sparse_parts(_dense_rows(torch.float64).to_sparse_csr())), ValueError,
         r"^input must have the weight's dtype torch\.float32, got torch\.float64; convert the "
         r"input \(x\.to\(torch\.float32\)\) or the layer \(\.to\(torch\.float64\)\)$"),
    Case("parts-decoder-bfloat16", lambda: nnsparse.SparseOutputLinear(3, 2)(
        _dense_rows(torch.bfloat16), nnsparse.sparse_parts(_PATTERN.to_sparse_csr())),
         ValueError,
         r"^weight must have input's dtype torch\.bfloat16, got torch\.float32; convert the "
         r"input \(x\.to\(torch\.float32\)\) or the layer \(\.to\(torch\.bfloat16\)\), "
         r"or run the forward under torch\.autocast, which reads it in the weight's dtype$"),
], ids=lambda c: c.id)
def test_dtype_refusals_say_what_to_do(case):
    run_case(case)


def test_input_dropout_idiom():
    """README's input dropout: ValuesMap(nn.Dropout(p)) on a sparse batch, off in eval()."""
    x = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.]]).to_sparse_csr()
    drop = nnsparse.ValuesMap(torch.nn.Dropout(0.5))
    with pytest.raises(NotImplementedError):  # torch's own module has no sparse kernel
        torch.nn.Dropout(0.5)(x)
    torch.manual_seed(1)
    out = drop(x)
    assert torch.equal(out.col_indices(), x.col_indices())
    assert set(out.values().tolist()) <= {0.0, 6.0, 2.0, 4.0}  # dropped or scaled by 2
    assert torch.equal(drop.eval()(x).values(), x.values())
