"""Tests of ``RatingModel.evaluate_ranking``: the full-ranking protocol against a brute-force
reference in plain Python, a hand-computed case, chunking, orientations, the three models,
fallback scores, and the messages of bad arguments."""
import math
from collections import defaultdict

import pytest
import torch

from nnsparse.data import Ratings, split_ratings, synthetic_ratings
from nnsparse.models import AutoRec, CFN, KernelNet

TINY = dict(hidden=8, epochs=1, validation_ratio=0.0)
KEYS = ("precision", "recall", "ndcg", "hit_rate")


def _reference(model, test, k, threshold=None, exclude_train=True):
    """The protocol in plain Python: each user's scores by predict_entries, one at a time."""
    n_items = test.n_items
    rated = defaultdict(set)
    for u, i in zip(model._train.user.tolist(), model._train.item.tolist()):
        rated[u].add(i)
    relevant = defaultdict(set)
    for u, i, r in zip(test.user.tolist(), test.item.tolist(), test.rating.tolist()):
        if threshold is None or r >= threshold:
            relevant[u].add(i)
    sums = dict.fromkeys(KEYS, 0.0)
    for u in sorted(relevant):
        pred = model.predict_entries(torch.full((n_items,), u), torch.arange(n_items)).tolist()
        candidates = [i for i in range(n_items) if not (exclude_train and i in rated[u])]
        ranked = sorted(candidates, key=lambda i: (-pred[i], i))[:k]
        hits = [i in relevant[u] for i in ranked]
        n = len(relevant[u])
        dcg = sum(1 / math.log2(p + 2) for p, hit in enumerate(hits) if hit)
        ideal = sum(1 / math.log2(p + 2) for p in range(min(k, n)))
        sums["precision"] += sum(hits) / k
        sums["recall"] += sum(hits) / n
        sums["ndcg"] += dcg / ideal
        sums["hit_rate"] += float(any(hits))
    users = len(relevant)
    return {**{f"{key}@{k}": value / users for key, value in sums.items()}, "users": users}


def _approx(expected):
    return {key: (value if key == "users" else pytest.approx(value, abs=1e-12))
            for key, value in expected.items()}


# -- a hand-computed case -------------------------------------------------------------------

# 2 users x 5 items.  Training: user 0 rated items 0, 1; user 1 items 2, 3, 4.
# Test: user 0 rated item 2 (5 stars) and item 4 (2 stars); user 1 item 0 (4 stars).
HAND_TABLE = torch.tensor([[4.5, 1.5, 3.0, 4.0, 3.0],    # user 0's predicted ratings
                           [2.0, 5.0, 4.5, 1.0, 3.5]])   # user 1's
G2, G3 = 1 / math.log2(3), 1 / math.log2(4)              # the discounts of places 2 and 3
HAND = [
    # k, threshold, exclude_train -> precision, recall, ndcg, hit rate
    # user 0 ranks 3 (4.0), 2 (3.0), 4 (3.0: the tie goes to item 2), user 1 ranks 1, 0:
    # each has its first relevant item in place 2
    (2, None, True, (1 / 2, (1 / 2 + 1) / 2, (G2 / (1 + G2) + G2) / 2, 1.0)),
    # relevant: rated >= 4, item 2 for user 0, item 0 for user 1
    (2, 4.0, True, (1 / 2, 1.0, G2, 1.0)),
    # training items ranked too: user 0's top 2 is 0, 3; user 1's is 1, 2: no hit
    (2, None, False, (0.0, 0.0, 0.0, 0.0)),
    # k 3 with training items: user 0 finds item 2 in place 3, user 1 nothing
    (3, None, False, (1 / 3 / 2, 1 / 2 / 2, G3 / (1 + G2) / 2, 1 / 2)),
    # k above the items: user 0's list holds its 3 candidates, user 1's its 2; precision
    # still divides by k, the ideal DCG by min(k, relevant)
    (10, None, True, ((2 / 10 + 1 / 10) / 2, 1.0, ((G2 + G3) / (1 + G2) + G2) / 2, 1.0)),
]


def _hand_model(orientation):
    users, items = [0, 0, 1, 1, 1, 0, 0, 1], [0, 1, 2, 3, 4, 2, 4, 0]
    ratings = [5., 1., 4., 2., 3., 5., 2., 4.]
    everything = Ratings.from_triples(users, items, ratings)
    train = everything.subset(torch.arange(5))
    test = everything.subset(torch.arange(5, 8))
    model = AutoRec(orientation=orientation, hidden=2, epochs=1, validation_ratio=0.0)
    model.fit(train, verbose=False, progress=False)
    table = HAND_TABLE if orientation == "user" else HAND_TABLE.T
    # the network's dense output (raw stars: AutoRec reads and predicts them) is the table
    model.network = lambda x, rows, pattern=None: table[rows].to(x.dtype)
    return model, test


@pytest.mark.parametrize("orientation", ["user", "item"])
@pytest.mark.parametrize("k, threshold, exclude, expected", HAND,
                         ids=[f"k{k}-threshold{t}-exclude{e}" for k, t, e, _ in HAND])
def test_a_hand_computed_case(orientation, k, threshold, exclude, expected):
    model, test = _hand_model(orientation)
    for batch_size in (1, 2, 256):
        got = model.evaluate_ranking(test, k, threshold=threshold, exclude_train=exclude,
                                     batch_size=batch_size, progress=False)
        assert got == _approx(dict(zip((f"{key}@{k}" for key in KEYS), expected), users=2))


# -- against the brute-force reference ------------------------------------------------------

@pytest.fixture(scope="module")
def data():
    return split_ratings(synthetic_ratings(seed=5, n_users=60, n_items=50, n_ratings=1200),
                         0.2, seed=0)


FITTED = [(AutoRec, "item"), (AutoRec, "user"), (CFN, "item"), (CFN, "user"),
          (KernelNet, "item"), (KernelNet, "user")]


@pytest.fixture(scope="module")
def models(data):
    train, _ = data
    out = {}
    for cls, orientation in FITTED:
        torch.manual_seed(0)
        out[cls.__name__, orientation] = cls(orientation=orientation, **TINY).fit(
            train, verbose=False, progress=False)
    return out


CASES = [dict(k=10), dict(k=1), dict(k=5, threshold=4.0), dict(k=10, exclude_train=False),
         dict(k=200)]


@pytest.mark.parametrize("cls, orientation", FITTED,
                         ids=[f"{c.__name__}-{o}" for c, o in FITTED])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_against_the_reference(models, data, cls, orientation, case):
    _, test = data
    model = models[cls.__name__, orientation]
    got = model.evaluate_ranking(test, **case, progress=False)
    assert got == _approx(_reference(model, test, **case))


@pytest.mark.parametrize("cls, orientation", FITTED,
                         ids=[f"{c.__name__}-{o}" for c, o in FITTED])
def test_chunks_of_one_row_give_the_same_numbers(models, data, cls, orientation):
    _, test = data
    model = models[cls.__name__, orientation]
    whole = model.evaluate_ranking(test, 10, batch_size=10 ** 6, progress=False)
    assert model.evaluate_ranking(test, 10, batch_size=1, progress=False) == whole
    assert model.evaluate_ranking(test, 10, batch_size=7, progress=False) == whole


@pytest.mark.parametrize("orientation", ["item", "user"])
def test_no_forward_holds_more_than_batch_size_rows(models, data, orientation):
    """The scores come batch_size matrix rows at a time: no users x items matrix."""
    _, test = data
    model = models["AutoRec", orientation]
    seen = []
    handle = model.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        model.evaluate_ranking(test, 10, batch_size=4, progress=False)
    finally:
        handle.remove()
    assert seen and all(shape[0] <= 4 for shape in seen)
    assert sum(shape[0] for shape in seen) == (len(set(test.user.tolist())) if orientation == "user"
                                               else int((model.item_count > 0).sum()))


@pytest.mark.parametrize("orientation", ["item", "user"])
def test_users_and_items_without_training_ratings_are_ranked_by_the_fallback(orientation):
    """A test user absent from training (ranked by the item means), an item absent from
    training (the user's mean), as predict_entries gives them."""
    r = synthetic_ratings(seed=6, n_users=40, n_items=30, n_ratings=700)
    users = r.user.tolist() + [40, 40, 3, 5]
    items = r.item.tolist() + [2, 30, 30, 30]
    everything = Ratings.from_triples(users, items, r.rating.tolist() + [4., 5., 3., 5.])
    n = len(r)
    test_part = torch.cat([torch.arange(0, n, 10), torch.arange(n, n + 4)])
    train_part = torch.tensor([i for i in range(n) if i % 10])
    train, test = everything.subset(train_part), everything.subset(test_part)
    assert everything.n_users == 41 and everything.n_items == 31
    torch.manual_seed(0)
    model = AutoRec(orientation=orientation, **TINY).fit(train, verbose=False, progress=False)
    _, counts = model.predict_entries(test.user, test.item, return_counts=True)
    assert counts["item_mean"] >= 1 and counts["user_mean"] >= 2
    for case in (dict(k=5), dict(k=40), dict(k=3, threshold=5.0), dict(k=5, exclude_train=False)):
        got = model.evaluate_ranking(test, **case, batch_size=3, progress=False)
        assert got == _approx(_reference(model, test, **case))


def test_a_perfect_and_a_useless_ranking():
    """Scores that put each user's test items first give 1 (recall hits / n, n <= k);
    scores that put them below every other candidate give 0."""
    model, test = _hand_model("user")
    table = torch.full((2, 5), 3.0)
    table[0, [2, 4]] = table[1, 0] = 5.0
    model.network = lambda x, rows, pattern=None: table[rows]
    got = model.evaluate_ranking(test, 2, progress=False)
    assert got == dict(_approx({"precision@2": (2 / 2 + 1 / 2) / 2, "recall@2": 1.0,
                                "ndcg@2": 1.0, "hit_rate@2": 1.0}), users=2)
    table[0, [2, 4]] = table[1, 0] = 1.0   # user 0 ranks 3 first, user 1 item 1
    got = model.evaluate_ranking(test, 1, progress=False)
    assert got == {"precision@1": 0.0, "recall@1": 0.0, "ndcg@1": 0.0, "hit_rate@1": 0.0,
                   "users": 2}


def test_a_nan_prediction_ranks_last():
    model, test = _hand_model("user")
    table = HAND_TABLE.clone()
    table[0, 3] = math.nan   # user 0's best candidate: now 2 and 4 (its test items) lead
    model.network = lambda x, rows, pattern=None: table[rows]
    got = model.evaluate_ranking(test, 2, progress=False)
    assert got["recall@2"] == pytest.approx((1 + 1) / 2)


def test_keys_carry_k_and_the_mode_is_restored(models, data):
    _, test = data
    model = models["KernelNet", "item"]
    model.train()
    try:
        got = model.evaluate_ranking(test, k=7, progress=False)
        assert model.training
    finally:
        model.eval()
    assert sorted(got) == ["hit_rate@7", "ndcg@7", "precision@7", "recall@7", "users"]
    assert isinstance(got["users"], int) and all(
        isinstance(v, float) and 0 <= v <= 1 for key, v in got.items() if key != "users")
    again = model.evaluate_ranking(test, k=7, progress=False)
    assert again == got  # training mode did not change the scores (CFN's noise, dropout)


def test_ties_go_to_the_smaller_item():
    from nnsparse.models._ranking import _top_k
    values = torch.tensor([[1., 3., 3., 2., 3., 3.], [0., 0., 0., 0., 0., 0.]])
    index = torch.tensor([[0, 5, 1, 2, 4, 3], [9, 8, 7, 6, 5, 4]])
    v, i = _top_k(values, index, 3)
    assert i.tolist() == [[1, 3, 4], [4, 5, 6]] and v.tolist() == [[3.] * 3, [0.] * 3]
    v, i = _top_k(values, index, 10)  # all of them, ordered
    assert i.tolist() == [[1, 3, 4, 5, 2, 0], [4, 5, 6, 7, 8, 9]]


def test_progress_bar(models, data, capsys):
    _, test = data
    model = models["AutoRec", "user"]
    model.evaluate_ranking(test, progress=True, batch_size=8)
    assert "ranking" in capsys.readouterr().err
    model.evaluate_ranking(test, progress=False, batch_size=8)
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("orientation", ["item", "user"])
def test_on_cuda_as_on_the_cpu(data, orientation):
    train, test = data
    torch.manual_seed(0)
    model = KernelNet(orientation=orientation, **TINY).fit(train, verbose=False, progress=False)
    cpu = model.evaluate_ranking(test, progress=False)
    model.to("cuda")
    got = model.evaluate_ranking(test, progress=False)
    assert got == _approx(cpu) and model.device.type == "cuda"


# -- bad arguments --------------------------------------------------------------------------

def _other_maps(test):
    return Ratings.from_triples([1, 0], [0, 0], [3., 4.])


def _repeated(test):
    return test.subset(torch.tensor([0, 0]))


def _empty(test):
    return test.subset(torch.tensor([], dtype=torch.int64))


BAD = [
    (dict(test="ratings"), TypeError, "test must be a Ratings record"),
    (dict(k=0), ValueError, "k must be a positive int, got 0"),
    (dict(k=2.0), TypeError, "k must be a positive int, got 2.0"),
    (dict(k=True), TypeError, "k must be a positive int, got True"),
    (dict(threshold="4"), TypeError, "threshold must be a real number or None, got str '4'"),
    (dict(threshold=True), TypeError, "threshold must be a real number or None, got bool"),
    (dict(threshold=math.nan), ValueError, "threshold must be finite or None, got nan"),
    (dict(threshold=-math.inf), ValueError, "threshold must be finite or None, got -inf"),
    (dict(threshold=5.5), ValueError, "test holds no relevant rating: none of its 240 ratings "
                                      "is >= threshold 5.5 (the highest is 5)"),
    (dict(exclude_train=1), TypeError, "exclude_train must be a bool, got int 1"),
    (dict(batch_size=0), ValueError, "batch_size must be a positive int, got 0"),
    (dict(batch_size=None), TypeError, "batch_size must be a positive int, got None"),
    (dict(progress="no"), TypeError, "progress must be None or a bool, got str 'no'"),
    (dict(test=_empty), ValueError, "test holds no ratings; there is nothing to rank"),
    (dict(test=_other_maps), ValueError, "test must index users as in the training ratings"),
    (dict(test=_repeated), ValueError, "test from synthetic_ratings(seed=5): 1 (user, item) pair "
                                      "rated more than once"),
    (dict(test="train"), ValueError, "test together with the model's training ratings from "
                                     "synthetic_ratings(seed=5): 960 (user, item) pairs rated "
                                     "more than once"),
    (dict(test="train"), ValueError, "with exclude_train=True a training pair is left out of "
                                     "the ranking, so a test rating of it could never be a hit"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD,
                         ids=[f"{list(kw)[0]}-{i}" for i, (kw, _, _) in enumerate(BAD)])
def test_bad_arguments(models, data, kwargs, error, match):
    train, test = data
    model = models["AutoRec", "item"]
    kwargs = dict(kwargs)
    given = kwargs.pop("test", test)
    given = train if given == "train" else given(test) if callable(given) else given
    state = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(error) as info:
        model.evaluate_ranking(given, **{"progress": False, **kwargs})
    assert match in str(info.value)
    assert not model.training  # a refused call changes nothing
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in state.items())


def test_counts_and_numbers_of_other_kinds(models, data):
    """k and batch_size as every count of nnsparse (numpy ints, 0-d integer tensors),
    threshold as any real number (an int, a numpy float)."""
    import numpy as np
    _, test = data
    model = models["CFN", "item"]
    expected = model.evaluate_ranking(test, 5, threshold=4.0, batch_size=16, progress=False)
    for k, size, threshold in ((np.int64(5), torch.tensor(16), 4), (torch.tensor(5),
                                                                     np.int32(16),
                                                                     np.float32(4.0))):
        assert model.evaluate_ranking(test, k, threshold=threshold, batch_size=size,
                                      progress=np.False_) == expected


def test_training_pairs_ranked_with_exclude_train_false(models, data):
    """exclude_train=False ranks the training items, so a test made of them is allowed."""
    train, _ = data
    model = models["AutoRec", "item"]
    got = model.evaluate_ranking(train, 5, exclude_train=False, progress=False)
    assert got == _approx(_reference(model, train, 5, exclude_train=False))


def test_an_unfitted_model_is_refused(data):
    _, test = data
    with pytest.raises(RuntimeError, match="AutoRec is not fitted; call fit"):
        AutoRec().evaluate_ranking(test)


# -- many ties and NaN across chunk boundaries, against a numpy reference -------------------

def _numpy_reference(table, train, test, k, threshold=None, exclude_train=True):
    """The protocol over a full ``users x items`` table of scores, in numpy: candidates
    sorted by (score descending, item ascending), NaN after every number and never a hit."""
    import numpy as np
    scores = np.where(np.isnan(table), -np.inf, table.astype(np.float64))
    rated = np.zeros(table.shape, dtype=bool)
    if exclude_train:
        rated[train.user.numpy(), train.item.numpy()] = True
    keep = np.ones(len(test), dtype=bool) if threshold is None else test.rating.numpy() >= threshold
    relevant = np.zeros(table.shape, dtype=bool)
    relevant[test.user.numpy()[keep], test.item.numpy()[keep]] = True
    users = np.unique(test.user.numpy()[keep])
    discount = 1 / np.log2(np.arange(k) + 2)
    rows = []
    for u in users:
        candidates = np.nonzero(~rated[u])[0]
        order = np.lexsort((candidates, -scores[u, candidates]))[:k]
        ranked = candidates[order]
        hits = relevant[u, ranked] & np.isfinite(scores[u, ranked])
        n = relevant[u].sum()
        rows.append((hits.sum() / k, hits.sum() / n,
                     (hits * discount[:len(hits)]).sum() / discount[:min(k, n)].sum(),
                     float(hits.any())))
    means = np.mean(rows, axis=0)
    return {**{f"{key}@{k}": float(v) for key, v in zip(KEYS, means)}, "users": len(users)}


@pytest.mark.parametrize("orientation", ["user", "item"])
def test_ties_and_nan_across_chunks_against_numpy(orientation):
    """Half-star scores (a dozen ties a list) with NaN among them: the running top k of an
    item-oriented model keeps the smaller item of a tie whichever chunk it came in."""
    everything = synthetic_ratings(seed=7, n_users=30, n_items=40, n_ratings=700)
    train, test = split_ratings(everything, 0.25, seed=0)
    assert bool((torch.bincount(train.user, minlength=30) > 0).all())
    assert bool((torch.bincount(train.item, minlength=40) > 0).all())
    model = AutoRec(orientation=orientation, hidden=2, epochs=1, validation_ratio=0.0)
    model.fit(train, verbose=False, progress=False)
    generator = torch.Generator().manual_seed(0)
    table = torch.randint(2, 11, (30, 40), generator=generator).float() / 2  # 1, 1.5, ..., 5
    table[torch.rand(30, 40, generator=generator) < 0.1] = math.nan
    rows = table if orientation == "user" else table.T
    # AutoRec reads and predicts raw stars: the network's dense output is the table
    model.network = lambda x, rows_, pattern=None: rows[rows_].to(x.dtype)
    for case in (dict(k=1), dict(k=5), dict(k=12), dict(k=50), dict(k=5, threshold=4.0),
                 dict(k=5, exclude_train=False)):
        expected = _approx(_numpy_reference(table.numpy(), train, test, **case))
        for batch_size in (1, 3, 7, 256):
            got = model.evaluate_ranking(test, **case, batch_size=batch_size, progress=False)
            assert got == expected, (case, batch_size)


@pytest.mark.parametrize("orientation", ["user", "item"])
def test_an_interrupt_mid_way_restores_the_mode(models, data, orientation):
    _, test = data
    model = models["AutoRec", orientation]
    network, calls = model.network, []

    def interrupted(x, rows, pattern=None):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return network(x, rows, pattern)

    model.network = interrupted
    model.train()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.evaluate_ranking(test, batch_size=4, progress=False)
        assert model.training and torch.is_grad_enabled()
    finally:
        del model.network  # the class's method again
        model.eval()
