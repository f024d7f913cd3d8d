"""The implicit-feedback user study (docs/user_study_implicit.md).

Mult-DAE / Mult-VAE (Liang et al. 2018) the nnsparse way: clicks as a sparse batch,
``ValuesMap(nn.Dropout)`` on the input, ``SparseLinearBatch`` encoder, a dense decoder and
``log_softmax`` over every item, the multinomial log-likelihood read at the clicks only
(``SparseCriterion(nn.KLDivLoss(reduction="batchmean"))``, refused before: 'batchmean'
was not a reduction nnsparse took, and its refusal said to use ``size_average=``, which has
no per-row averaging), and ``ranking_metrics`` with the paper's Recall@k
(``recall="min"``: hits / min(k, n); the textbook hits / n stays the default), both
against dense references of the paper's definitions.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnsparse
from nnsparse.data import Ratings, ranking_metrics

from probe_cases import Case, run_case


def _clicks(rows=16, items=30, seed=0, dtype=torch.float64):
    """A binary click matrix (dense), one empty row, every other row >= 1 click."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, items, generator=g) < 0.2).to(dtype)
    x[torch.arange(rows), torch.randint(0, items, (rows,), generator=g)] = 1
    x[5] = 0
    return x


class _MultDAE(nn.Module):
    def __init__(self, items, hidden=8):
        super().__init__()
        self.drop = nnsparse.ValuesMap(nn.Dropout(0.5))
        self.enc = nnsparse.SparseLinearBatch(items, hidden)
        self.dec = nn.Linear(hidden, items)

    def forward(self, x):
        return F.log_softmax(self.dec(torch.tanh(self.enc(self.drop(x)))), dim=1)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
@pytest.mark.parametrize("normalised", [False, True])
def test_multinomial_loss_and_gradients_match_dense_reference(layout, normalised):
    torch.manual_seed(0)
    x = _clicks()
    if normalised:  # the paper's L2-normalised input rows: the loss moves by a constant
        x = F.normalize(x, dim=1)
    xs = x.to_sparse_csr() if layout == torch.sparse_csr else x.to_sparse()
    model = _MultDAE(x.shape[1]).double().eval()
    reference = _MultDAE(x.shape[1]).double().eval()
    reference.load_state_dict(model.state_dict())
    crit = nnsparse.SparseCriterion(nn.KLDivLoss(reduction="batchmean"))
    loss = crit(model(xs), xs)
    loss.backward()
    dense_logp = F.linear(torch.tanh(F.linear(x, reference.enc.weight, reference.enc.bias)),
                          reference.dec.weight, reference.dec.bias).log_softmax(1)
    expected = -(dense_logp * x).sum(1).mean()
    expected.backward()
    constant = (torch.xlogy(x, x)).sum(1).mean()  # KL's x log x: 0 for binary clicks
    torch.testing.assert_close(loss, expected + constant)
    assert (constant == 0) != normalised
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, dict(reference.named_parameters())[name].grad,
                                   msg=name)


_LOGP = torch.randn(3, 4, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64).log_softmax(1)
_CLICKS = torch.tensor([[1., 0., 1., 0.], [0., 0., 0., 0.], [0., 1., 0., 0.]],
                       dtype=torch.float64)
_PAIRS = [torch.tensor([[0, 1.], [2, 1.]], dtype=torch.float64),
          torch.zeros(0, 2, dtype=torch.float64), torch.tensor([[1, 1.]], dtype=torch.float64)]

# (id, estimate, target, dense estimate, dense target): every form divides by torch's
# input.size(0), the rows of a batch and n of a vector (n,), as F.kl_div's 'batchmean'
_BATCHMEAN_FORMS = [
    ("dense-coo", lambda e: e, lambda: _CLICKS.to_sparse(), _LOGP, _CLICKS),
    ("dense-csr", lambda e: e, lambda: _CLICKS.to_sparse_csr(), _LOGP, _CLICKS),
    ("sparse-estimate", lambda e: e.to_sparse(), lambda: _CLICKS.to_sparse(), _LOGP, _CLICKS),
    ("list-of-rows", lambda e: e, lambda: [r.to_sparse() for r in _CLICKS], _LOGP, _CLICKS),
    ("lua-pair-rows", lambda e: e, lambda: _PAIRS, _LOGP, _CLICKS),
    ("vector", lambda e: e, lambda: _CLICKS[0].to_sparse(), _LOGP[0], _CLICKS[0]),
    ("vector-lua-pairs", lambda e: e, lambda: _PAIRS[0], _LOGP[0], _CLICKS[0]),
]


@pytest.mark.parametrize("form, estimate, target, dense, x", _BATCHMEAN_FORMS,
                         ids=[f[0] for f in _BATCHMEAN_FORMS])
def test_batchmean_divides_by_input_size_0_as_torch(form, estimate, target, dense, x):
    crit = nnsparse.SparseCriterion(nn.KLDivLoss(reduction="batchmean"))
    leaf = dense.clone().requires_grad_()
    loss = crit(estimate(leaf), target())
    loss.backward()
    ref_leaf = dense.clone().requires_grad_()
    expected = F.kl_div(ref_leaf, x, reduction="batchmean")
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    assert torch.autograd.gradcheck(lambda e: crit(estimate(e), target()),
                                    (dense.clone().requires_grad_(),))


def test_batchmean_empty_batch_is_zero():
    empty = nnsparse.SparseCriterion(nn.KLDivLoss(reduction="batchmean"))(
        torch.zeros(0, 4), torch.zeros(0, 4).to_sparse())
    assert float(empty) == 0.0  # F.kl_div gives nan (0 / 0): nnsparse's empty batch is 0


_KL_BM = nn.KLDivLoss(reduction="batchmean")
_X = torch.tensor([[1., 0.]]).to_sparse()

_REFUSALS = [
    Case("batchmean-size_average", lambda: nnsparse.SparseCriterion(_KL_BM, size_average=True),
         ValueError, r"reduction='batchmean' contradicts size_average=True; keep one of them"),
    Case("batchmean-full_size_average",
         lambda: nnsparse.SparseCriterion(_KL_BM, full_size_average=True), ValueError,
         r"reduction='batchmean' contradicts full_size_average=True; keep one of them"),
    Case("mask-batchmean", lambda: nnsparse.MaskCriterion(_KL_BM), ValueError,
         r"MaskCriterion: .*got 'batchmean'; for 'batchmean' \(the sum divided by the "
         r"batch's rows\) pass reduction='sum' and divide the loss by the number of rows, "
         r"or wrap the loss in SparseCriterion"),
    Case("sdae-batchmean", lambda: nnsparse.SDAESparseCriterion(_KL_BM), ValueError,
         r"SDAESparseCriterion: .*got 'batchmean'; for 'batchmean'.*reduction='sum'"),
    Case("mse-batchmean", lambda: nnsparse.SparseCriterion(nn.MSELoss(reduction="batchmean")),
         ValueError, r"SparseCriterion: reduction='batchmean' is nn.KLDivLoss's only, got it on "
         r"MSELoss \(torch's MSELoss refuses it too\); pass reduction='sum' and divide the "
         r"loss by the number of rows"),
    Case("mask-bce-batchmean", lambda: nnsparse.MaskCriterion(nn.BCELoss(reduction="batchmean")),
         ValueError, r"MaskCriterion: reduction='batchmean' is nn.KLDivLoss's only, got it on "
         r"BCELoss"),
    Case("none-keeps-its-hint", lambda: nnsparse.SparseCriterion(nn.KLDivLoss(reduction="none")),
         ValueError, r"got 'none'; use size_average= to choose the averaging"),
    Case("none-kl-lists-batchmean",
         lambda: nnsparse.SparseCriterion(nn.KLDivLoss(reduction="none")), ValueError,
         r"SparseCriterion: the criterion's reduction must be 'mean' or 'sum', or 'batchmean' "
         r"for nn.KLDivLoss \(an nnsparse criterion returns a scalar\), got 'none'"),
    Case("none-mse-no-batchmean", lambda: nnsparse.SparseCriterion(nn.MSELoss(reduction="none")),
         ValueError, r"reduction must be 'mean' or 'sum' \(an nnsparse criterion returns a "
         r"scalar\), got 'none'"),
    Case("batchmean-works", lambda: nnsparse.SparseCriterion(_KL_BM)(torch.zeros(1, 2), _X),
         None, check=lambda out: float(out) == 0.0),
]


@pytest.mark.parametrize("case", _REFUSALS, ids=lambda c: c.id)
def test_batchmean_refusals_say_what_to_do(case):
    run_case(case)


def test_batchmean_assigned_later_is_checked():
    crit = nnsparse.SparseCriterion(nn.KLDivLoss(), full_size_average=True)
    crit.criterion = nn.KLDivLoss(reduction="batchmean")
    with pytest.raises(ValueError, match="reduction='batchmean' contradicts full_size_average"):
        crit(torch.zeros(1, 2), _X)


def _held_ratings(held):
    """The held-out clicks of a dense ``(users, items)`` 0/1 matrix as Ratings whose
    indices are the matrix's (every user and item in the maps, clicked or not)."""
    user, item = held.nonzero().unbind(1)
    return Ratings(user, item, torch.ones(len(user)),
                   {u: u for u in range(held.shape[0])}, {i: i for i in range(held.shape[1])})


def _paper_metrics(scores, seen, held, k):
    """Liang et al. 2018's NDCG@k and Recall@k (hits / min(k, n)), dense, one user a row."""
    s = scores.masked_fill(seen > 0, -math.inf)
    users = (held > 0).any(1)
    s, held = s[users], held[users]
    hit = held.gather(1, s.topk(k, 1).indices) > 0
    n = held.sum(1)
    discount = 1 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64))
    dcg = (hit * discount).sum(1)
    idcg = torch.stack([discount[:int(min(m, k))].sum() for m in n])
    return {"ndcg": float((dcg / idcg).mean()),
            "recall_min": float((hit.sum(1) / n.clamp(max=k)).mean()),
            "recall_n": float((hit.sum(1) / n).mean())}


@pytest.mark.parametrize("k", [1, 3, 5, 20])
def test_ranking_metrics_against_the_papers_definitions(k):
    g = torch.Generator().manual_seed(1)
    users, items = 40, 25
    seen = (torch.rand(users, items, generator=g) < 0.3).double()
    held = (torch.rand(users, items, generator=g) < 0.35).double() * (1 - seen)
    held[7] = 0  # a user with no held-out click is left out
    scores = torch.randn(users, items, generator=g, dtype=torch.float64)
    top = scores.masked_fill(seen > 0, -math.inf).topk(k, 1)  # torch.topk after masking
    test = _held_ratings(held)
    paper = _paper_metrics(scores, seen, held, k)
    ours = ranking_metrics(top, test, k)
    truncated = ranking_metrics(top, test, k, recall="min")
    assert ours["users"] == truncated["users"] == users - 1
    assert math.isclose(ours[f"ndcg@{k}"], paper["ndcg"], rel_tol=1e-12)
    assert math.isclose(ours[f"recall@{k}"], paper["recall_n"], rel_tol=1e-12)
    assert math.isclose(truncated[f"recall@{k}"], paper["recall_min"], rel_tol=1e-12)
    assert {key: v for key, v in truncated.items() if "recall" not in key} == \
        {key: v for key, v in ours.items() if "recall" not in key}


_TEST = Ratings.from_triples([0, 0, 1], [0, 1, 2], [1., 1., 1.])
_TOP = torch.tensor([[1, 2], [0, 2]])

_RECALL_CASES = [
    Case("recall-n-default", lambda: ranking_metrics(_TOP, _TEST, 1)["recall@1"], None,
         check=lambda r: r == 0.25),  # user 0: 1 / 2, user 1: 0 / 1
    Case("recall-min", lambda: ranking_metrics(_TOP, _TEST, 1, recall="min")["recall@1"], None,
         check=lambda r: r == 0.5),  # user 0: 1 / min(1, 2)
    Case("recall-min-k-above-n", lambda: ranking_metrics(_TOP, _TEST, recall="min")["recall@2"],
         None, check=lambda r: r == 0.75),  # min(k, n) = n: the textbook recall
    Case("recall-typo", lambda: ranking_metrics(_TOP, _TEST, recall="truncated"), ValueError,
         r"recall must be one of \['n', 'min'\], got 'truncated' \(the denominator: n "
         r"relevant items, or min\(k, n\)\)"),
    Case("recall-none", lambda: ranking_metrics(_TOP, _TEST, recall=None), TypeError,
         r"recall must be one of \['n', 'min'\] \(a str\), got NoneType None"),
    Case("recall-bool", lambda: ranking_metrics(_TOP, _TEST, recall=True), TypeError,
         r"recall must be one of \['n', 'min'\] \(a str\), got bool True"),
]


@pytest.mark.parametrize("case", _RECALL_CASES, ids=lambda c: c.id)
def test_ranking_metrics_recall_option(case):
    run_case(case)


def test_batchifier_topk_exclude_feeds_ranking_metrics():
    """The study's evaluation path: fold-in clicks through the network, the seen items
    excluded by ``Batchifier.topk(exclude=True)``, scored against held-out clicks."""
    torch.manual_seed(0)
    x = _clicks(rows=12, items=20, seed=3)
    held = (torch.rand(12, 20) < 0.2).double() * (1 - x)
    model = _MultDAE(20).double().eval()
    fold_in = x.to_sparse_csr()
    top = nnsparse.Batchifier(model, 20, batch_size=5, progress=False).topk(
        fold_in, 10, exclude=True)
    with torch.no_grad():
        scores = model(fold_in)
    test = _held_ratings(held)
    paper = _paper_metrics(scores, x, held, 10)
    got = ranking_metrics(top, test, 10, recall="min")
    assert math.isclose(got["ndcg@10"], paper["ndcg"], rel_tol=1e-12)
    assert math.isclose(got["recall@10"], paper["recall_min"], rel_tol=1e-12)
