"""``rating_matrix(..., rows=)`` and ``ranking_metrics(..., users=)``: the matrices and the
lists of some users only (the held-out users of ``user_split``), with no row for the others.

Each is checked against a dense reference (the rows of the full matrix picked by index; the
figures of the padded ``(n_users, k)`` table the caller had to build before) and each bad
argument by its message."""
import dataclasses
import math
import re
import sys

import numpy as np
import pytest
import torch

from nnsparse import densify
from nnsparse.data import (Ratings, rating_matrix, ranking_metrics, synthetic_ratings,
                           user_split)

from probe_cases import Case, run_case


def _ratings():
    return synthetic_ratings(seed=7, n_users=40, n_items=30, n_ratings=500, titles=False)


def _dense(r, orientation):
    """The full matrix, one row per row of the maps, as a dense reference."""
    d = torch.zeros(r.n_users, r.n_items)
    d[r.user, r.item] = r.rating
    return d if orientation == "user" else d.T


def _held(r, orientation, picked):
    """The ratings of ``picked`` (user or item indices) only."""
    index = r.user if orientation == "user" else r.item
    return r.subset(torch.isin(index, torch.as_tensor(picked, dtype=torch.long)))


# rows: sorted, shuffled, one row, none, every row, rows without a rating, int32, a list,
# a numpy array, a range
ROWS = [
    ("sorted", lambda n: torch.arange(0, n, 3)),
    ("shuffled", lambda n: torch.randperm(n, generator=torch.Generator().manual_seed(0))[:9]),
    ("one", lambda n: torch.tensor([n - 1])),
    ("none", lambda n: torch.tensor([], dtype=torch.long)),
    ("all-reversed", lambda n: torch.arange(n - 1, -1, -1)),
    ("int32", lambda n: torch.tensor([5, 2, 11], dtype=torch.int32)),
    ("int16", lambda n: torch.tensor([5, 2, 11], dtype=torch.int16)),
    ("list", lambda n: [4, 0, 7]),
    ("numpy", lambda n: np.array([8, 1])),
    ("range", lambda n: range(3, 9)),
]


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo], ids=["csr", "coo"])
@pytest.mark.parametrize("orientation", ["user", "item"])
@pytest.mark.parametrize("name, make", ROWS, ids=[name for name, _ in ROWS])
@pytest.mark.parametrize("with_shape", [False, True], ids=["no-shape", "shape"])
def test_rating_matrix_rows_dense_reference(name, make, orientation, layout, with_shape):
    r = _ratings()
    n, width = (r.n_users, r.n_items) if orientation == "user" else (r.n_items, r.n_users)
    picked = make(n)
    part = _held(r, orientation, picked)
    shape = (len(picked), width + 2) if with_shape else None  # shape widens the columns
    m = rating_matrix(part, orientation, layout=layout, shape=shape, rows=picked)
    index = torch.as_tensor(np.asarray(picked), dtype=torch.long)
    expected = _dense(r, orientation)[index]
    if with_shape:
        expected = torch.cat([expected, torch.zeros(len(index), 2)], 1)
    assert m.layout == layout and m.shape == expected.shape
    assert m.device == part.user.device and m.dtype == part.rating.dtype
    assert torch.equal(densify(m), expected)
    assert m._nnz() == len(part)  # every rating a specified entry, zeros too
    if layout == torch.sparse_coo:
        assert m.is_coalesced()


def _wide(r, extra=5000):
    """``r`` on id maps ``extra`` ids wider (ids that rate nothing): the rows are then found
    by a binary search, not a table of the map's size (larger than the entries)."""
    def widened(mapping):
        top = max(mapping) + 1
        return {**mapping, **{top + i: len(mapping) + i for i in range(extra)}}
    return dataclasses.replace(r, user_map=widened(r.user_map), item_map=widened(r.item_map))


def _searched(monkeypatch):
    """The calls of ``torch.searchsorted`` from ``nnsparse.data.readers`` from now on (there,
    only the binary search of the rows' lookup calls it): a list that grows by one a call."""
    calls = []
    search = torch.searchsorted

    def counted(*args, **kwargs):
        if sys._getframe(1).f_globals["__name__"] == "nnsparse.data.readers":
            calls.append(1)
        return search(*args, **kwargs)
    monkeypatch.setattr(torch, "searchsorted", counted)
    return calls


# (lookup, name, make): the rows that place by a table on _ratings()'s maps (as many rows
# and entries as the map: one row, or two of numpy's, hold fewer), and by the search on
# _wide's; "none" takes neither (no row to find)
LOOKUPS = ([("table", name, make) for name, make in ROWS
            if name in ("sorted", "shuffled", "all-reversed", "list", "range")]
           + [("search", name, make) for name, make in ROWS if name != "none"])


@pytest.mark.parametrize("orientation", ["user", "item"])
@pytest.mark.parametrize("maps, name, make", LOOKUPS, ids=[f"{m}-{n}" for m, n, _ in LOOKUPS])
def test_rating_matrix_rows_either_lookup(maps, name, make, orientation, monkeypatch):
    """A map no larger than the entries: the rows' positions from a table; a wider one
    (``_wide``): from a binary search.  Both the dense reference's rows."""
    r = _ratings() if maps == "table" else _wide(_ratings())
    n = r.n_users if orientation == "user" else r.n_items
    picked = make(n if maps == "table" else 30)
    part = _held(r, orientation, picked)
    searched = _searched(monkeypatch)
    m = rating_matrix(part, orientation, rows=picked)
    assert bool(searched) == (maps == "search")  # the lookup the test is named for
    monkeypatch.undo()
    index = torch.as_tensor(np.asarray(picked), dtype=torch.long)
    assert torch.equal(densify(m), _dense(r, orientation)[index])


@pytest.mark.parametrize("maps", ["table", "search"])
def test_rating_matrix_rows_of_an_index_edited_out_of_range(maps, monkeypatch):
    """An index made negative or past the map in place, after the record was checked, is a
    row not listed (refused by name), in either lookup, never an indexing error."""
    for bad in (-1, 10 ** 6):
        r = _small() if maps == "table" else _wide(_small())
        r.user[0] = bad
        searched = _searched(monkeypatch)
        with pytest.raises(ValueError, match=rf"^rows must hold every user of the ratings, "
                                             rf"got no row for user {bad}[;,]"):
            rating_matrix(r, "user", rows=[0, 1, 2, 3])
        assert bool(searched) == (maps == "search")
        monkeypatch.undo()


@pytest.mark.parametrize("maps", ["table", "search"])
def test_ranking_metrics_users_either_lookup(maps):
    test = _test_ratings() if maps == "table" else _wide(_test_ratings())
    users = [5, 1, 0, 4, 2]
    lists = _lists(len(users))
    got = ranking_metrics(lists, test, 3, users=users)
    assert got == ranking_metrics(_padded(lists, users, test.n_users, 4), test, 3)


def test_rating_matrix_rows_values_and_zeros():
    # values= goes with rows=; a rating of 0 stays a specified entry of its row
    r = Ratings.from_triples([0, 1, 1, 2], [0, 0, 1, 1], [0.0, 2.0, 3.0, 4.0])
    part = r.subset(torch.tensor([0, 1, 2]))  # users 0 and 1
    m = rating_matrix(part, "user", rows=[1, 0], values=torch.tensor([7.0, 8.0, 9.0]))
    assert m.crow_indices().tolist() == [0, 2, 3] and m.col_indices().tolist() == [0, 1, 0]
    assert m.values().tolist() == [8.0, 9.0, 7.0]
    zero = rating_matrix(part, "user", rows=[0, 1])
    assert zero.values().tolist() == [0.0, 2.0, 3.0]


def test_rating_matrix_rows_of_a_user_split_feed_every_row():
    # the held-out users' matrix holds no empty row for the other users of the maps
    split = user_split(_ratings(), test=6, validation=4, seed=0)
    fold_in = split.test.fold_in
    users = torch.unique(fold_in.user)
    m = rating_matrix(fold_in, "user", rows=users)
    assert m.shape == (6, fold_in.n_items)
    assert bool((m.crow_indices().diff() > 0).all())
    full = rating_matrix(fold_in, "user")
    assert torch.equal(densify(m), densify(full)[users])


def test_rating_matrix_rows_repeated_pair_names_the_ids():
    r = Ratings.from_triples([10, 10, 20], [5, 5, 6], [1.0, 2.0, 3.0], source="dup")
    with pytest.raises(ValueError, match=r"^ratings from dup: 1 \(user, item\) pair rated "
                                         r"more than once, e\.g\. user 10 and item 5"):
        rating_matrix(r, "user", rows=[1, 0])


def _small():
    # users 0..3, items 0..2; users 1 and 3 only
    r = Ratings.from_triples([0, 1, 1, 2, 3], [0, 0, 2, 1, 1], [1.0, 2.0, 3.0, 4.0, 5.0])
    return r.subset(torch.tensor([1, 2, 4]))


BAD_ROWS = [
    Case("missing-row", lambda: rating_matrix(_small(), "user", rows=[3]), ValueError,
         r"^rows must hold every user of the ratings, got no row for user 1; select the "
         r"ratings of rows first: ratings\.subset\(torch\.isin\(ratings\.user, "
         r"torch\.as_tensor\(rows\)\)\)$"),
    Case("missing-row-tensor", lambda: rating_matrix(_small(), "user", rows=torch.tensor([3])),
         ValueError, r"; select the ratings of rows first: ratings\.subset\(torch\.isin\("
                     r"ratings\.user, rows\)\)$"),
    Case("missing-rows", lambda: rating_matrix(_small(), "item", rows=[0]), ValueError,
         r"^rows must hold every item of the ratings, got no row for item 1, nor for 1 "
         r"other item; select"),
    Case("no-rows", lambda: rating_matrix(_small(), "user", rows=[]), ValueError,
         r"^rows must hold every user of the ratings, got no row for user 1, nor for 1 "
         r"other user;"),
    Case("twice", lambda: rating_matrix(_small(), "user", rows=[1, 3, 1]), ValueError,
         r"^rows must hold each user once, got user 1 twice$"),
    Case("out-of-range", lambda: rating_matrix(_small(), "user", rows=[1, 3, 4]), ValueError,
         r"^rows must be user indices in \[0, 4\), got 4$"),
    Case("negative", lambda: rating_matrix(_small(), "item", rows=[-1, 0]), ValueError,
         r"^rows must be item indices in \[0, 3\), got -1$"),
    Case("2-d", lambda: rating_matrix(_small(), "user", rows=torch.tensor([[1, 3]])),
         ValueError, r"^rows must be 1-D \(user indices\), got shape \(1, 2\)$"),
    Case("float", lambda: rating_matrix(_small(), "user", rows=torch.tensor([1.0, 3.0])),
         TypeError, r"^rows must hold integer user indices, got dtype torch\.float32$"),
    Case("float-list", lambda: rating_matrix(_small(), "user", rows=[1.0, 3.0]),
         TypeError, r"^rows must hold integer user indices, got dtype torch\.float32$"),
    Case("bool", lambda: rating_matrix(_small(), "user", rows=torch.tensor([0, 1, 0, 1]) > 0),
         TypeError, r"^rows must hold integer user indices, got dtype torch\.bool; for the "
                    r"users of a mask, pass mask\.nonzero\(\)\.squeeze\(1\)$"),
    Case("bool-list", lambda: rating_matrix(_small(), "item", rows=[True, False, True]),
         TypeError, r"^rows must hold integer item indices, got dtype torch\.bool; for the "
                    r"items of a mask"),
    Case("twice-first-named", lambda: rating_matrix(_small(), "user", rows=[3, 1, 3, 1]),
         ValueError, r"^rows must hold each user once, got user 1 twice$"),
    Case("twice-out-of-range", lambda: rating_matrix(_small(), "user", rows=[5, 1, 5]),
         ValueError, r"^rows must be user indices in \[0, 4\), got 5$"),
    Case("int8", lambda: rating_matrix(_small(), "user", rows=torch.tensor(
        [3, 1], dtype=torch.int8)), None,
         check=lambda m: m.to_dense().equal(rating_matrix(_small(), "user", rows=[3, 1])
                                            .to_dense())),
    Case("int16-one", lambda: rating_matrix(_small().subset(_small().user == 1), "user",
                                            rows=torch.tensor([1], dtype=torch.int16)),
         None, check=lambda m: m.shape[0] == 1 and m.values().numel() > 0),
    Case("uint8", lambda: rating_matrix(_small(), "user", rows=torch.tensor(
        [1, 3], dtype=torch.uint8)), TypeError, r"^rows must be int64 user indices, got "
        r"torch\.uint8, which torch would read as a mask; convert it with \.long\(\)$"),
    Case("str", lambda: rating_matrix(_small(), "user", rows="13"), TypeError,
         r"^rows must be a 1-D integer tensor or a sequence of ints \(user indices\), got str$"),
    Case("int", lambda: rating_matrix(_small(), "user", rows=3), TypeError,
         r"^rows must be a 1-D integer tensor or a sequence of ints \(user indices\), got int$"),
    Case("sparse", lambda: rating_matrix(_small(), "user", rows=torch.tensor(
        [1, 3]).to_sparse()), TypeError, r"^rows must be .* got layout torch\.sparse_coo$"),
    Case("meta", lambda: rating_matrix(_small(), "user", rows=torch.tensor([1, 3],
                                                                          device="meta")),
         ValueError, r"rows"),
    Case("shape-rows", lambda: rating_matrix(_small(), "user", shape=(4, 3), rows=[1, 3]),
         ValueError, r"^shape must have len\(rows\) = 2 rows when rows is given \(it sets the "
                     r"width only\), got \(4, 3\)$"),
    Case("shape-narrow", lambda: rating_matrix(_small(), "user", shape=(2, 2), rows=[1, 3]),
         ValueError, r"^user matrix column indices must be in \[0, 2\), got max 2"),
    Case("shape-kind", lambda: rating_matrix(_small(), "user", shape=(2.0, 3), rows=[1, 3]),
         TypeError, r"^shape must be two non-negative ints"),
    Case("shape-good", lambda: rating_matrix(_small(), "user", shape=[2, 5], rows=[3, 1]),
         None, check=lambda m: m.shape == (2, 5) and m.col_indices().tolist() == [1, 0, 2]),
]


@pytest.mark.parametrize("case", BAD_ROWS, ids=lambda c: c.id)
def test_rating_matrix_rows_cases(case):
    run_case(case)


# -- ranking_metrics(..., users=)

def _test_ratings():
    # users 0..5 (user 3 has no test rating, user 5 only one below 4), items 0..7
    user = [0, 0, 0, 1, 2, 2, 4, 4, 4, 4, 5]
    item = [0, 1, 2, 3, 4, 0, 5, 6, 7, 1, 2]
    rating = [5., 2., 4., 3., 1., 5., 4., 4., 2., 5., 2.]
    return Ratings.from_triples(user + [3], item + [0], rating + [1.]).subset(torch.arange(11))


def _padded(lists, users, n_users, k):
    """The padded ``(n_users, k)`` table ranking_metrics read before users=: the lists in
    their users' rows, -inf / -1 (no item) elsewhere (the reference)."""
    values = torch.full((n_users, k), -math.inf)
    indices = torch.full((n_users, k), -1, dtype=torch.int64)
    index = torch.as_tensor(np.asarray(users), dtype=torch.long)
    values[index], indices[index] = lists.values, lists.indices
    return torch.return_types.topk((values, indices))


def _lists(n, k=4, seed=0):
    scores = torch.rand(n, 8, generator=torch.Generator().manual_seed(seed))
    scores[0, 3] = -math.inf  # a list cut short (Batchifier.topk's padding after exclude)
    return scores.topk(k, dim=1)


# users: the test users in order, shuffled, with users of no relevant rating, int32, lists,
# a numpy array; thresholds and recall denominators
USERS = [
    ("in-order", [0, 1, 2, 4, 5], None, "n"),
    ("shuffled", [4, 0, 5, 2, 1], None, "min"),
    ("extra-users", [3, 4, 0, 5, 2, 1], None, "n"),
    ("threshold", [4, 0, 2], 4.0, "n"),  # users 1 and 5 rate nothing >= 4
    ("threshold-extra", [5, 4, 1, 0, 2], 4.0, "min"),
    ("int32", torch.tensor([2, 1, 0, 5, 4], dtype=torch.int32), None, "n"),
    ("numpy", np.array([5, 4, 2, 1, 0]), None, "n"),
    ("tensor", torch.tensor([1, 2, 0, 4, 5]), None, "min"),
]


@pytest.mark.parametrize("k", [1, 3, 4, 6])
@pytest.mark.parametrize("name, users, threshold, recall", USERS,
                         ids=[u[0] for u in USERS])
def test_ranking_metrics_users_equals_the_padded_table(name, users, threshold, recall, k):
    test = _test_ratings()
    lists = _lists(len(users))
    got = ranking_metrics(lists, test, k, threshold=threshold, recall=recall, users=users)
    expected = ranking_metrics(_padded(lists, users, test.n_users, 4), test, k,
                               threshold=threshold, recall=recall)
    assert got == expected
    plain = ranking_metrics(lists.indices, test, k, threshold=threshold, recall=recall,
                            users=users)  # indices only: the -inf place is read as an item
    assert plain["users"] == got["users"]


def test_ranking_metrics_users_of_a_user_split():
    # the held-out users' lists alone score as the (n_users, k) table did
    split = user_split(_ratings(), test=8, validation=4, seed=1)
    fold_in, target = split.test
    users = torch.unique(torch.cat([fold_in.user, target.user]))
    scores = torch.rand(len(users), target.n_items, generator=torch.Generator().manual_seed(1))
    scores[torch.searchsorted(users, fold_in.user), fold_in.item] = -math.inf
    top = scores.topk(10, dim=1)
    got = ranking_metrics(top, target, 10, recall="min", users=users)
    assert got == ranking_metrics(_padded(top, users, target.n_users, 10), target, 10,
                                  recall="min")
    assert got["users"] == len(torch.unique(target.user))


_T = _test_ratings


BAD_USERS = [
    Case("missing-user", lambda: ranking_metrics(_lists(4).indices, _T(), users=[0, 1, 2, 4]),
         ValueError, r"^users must hold every test user with a relevant rating \(row j of "
                     r"top: user users\[j\]'s list\), got no row for user 5; score a part of "
                     r"the users by selecting their test ratings: test\.subset\(torch\.isin\("
                     r"test\.user, torch\.as_tensor\(users\)\)\)$"),
    Case("missing-user-tensor", lambda: ranking_metrics(_lists(4).indices, _T(),
                                                        users=torch.tensor([0, 1, 2, 4])),
         ValueError, r"test\.subset\(torch\.isin\(test\.user, users\)\)$"),
    Case("missing-users", lambda: ranking_metrics(_lists(2).indices, _T(), users=[1, 3]),
         ValueError, r"got no row for user 0, nor for 3 other test users; score"),
    Case("missing-relevant", lambda: ranking_metrics(_lists(2).indices, _T(), threshold=4.0,
                                                     users=[0, 4]),
         ValueError, r"got no row for user 2; score"),
    Case("none-listed", lambda: ranking_metrics(_lists(1).indices[:0], _T(), users=[]),
         ValueError, r"got no row for user 0, nor for 4 other test users"),
    Case("length", lambda: ranking_metrics(_lists(5).indices, _T(), users=[0, 1, 2, 4]),
         ValueError, r"^users must name the user of each row of top, so 5 users, got 4$"),
    Case("twice", lambda: ranking_metrics(_lists(5).indices, _T(), users=[0, 1, 2, 4, 0]),
         ValueError, r"^users must hold each user once, got user 0 twice$"),
    Case("out-of-range", lambda: ranking_metrics(_lists(5).indices, _T(), users=[0, 1, 2, 4, 6]),
         ValueError, r"^users must be user indices in \[0, 6\), got 6$"),
    Case("negative", lambda: ranking_metrics(_lists(5).indices, _T(), users=[0, 1, 2, 4, -1]),
         ValueError, r"^users must be user indices in \[0, 6\), got -1$"),
    Case("2-d", lambda: ranking_metrics(_lists(5).indices, _T(), users=[[0, 1, 2, 4, 5]]),
         ValueError, r"^users must be 1-D \(user indices\), got shape \(1, 5\)$"),
    Case("float", lambda: ranking_metrics(_lists(2).indices, _T(), users=[0.0, 1.0]),
         TypeError, r"^users must hold integer user indices, got dtype torch\.float32$"),
    Case("bool", lambda: ranking_metrics(_lists(6).indices, _T(), users=torch.ones(
        6, dtype=torch.bool)), TypeError, r"^users must hold integer user indices, got dtype "
        r"torch\.bool; for the users of a mask, pass mask\.nonzero\(\)\.squeeze\(1\)$"),
    Case("uint8", lambda: ranking_metrics(_lists(2).indices, _T(), users=torch.tensor(
        [0, 1], dtype=torch.uint8)), TypeError, r"^users must be int64 user indices, got "
        r"torch\.uint8, which torch would read as a mask"),
    Case("str", lambda: ranking_metrics(_lists(2).indices, _T(), users="01"), TypeError,
         r"^users must be a 1-D integer tensor or a sequence of ints \(user indices\), got str$"),
    Case("meta", lambda: ranking_metrics(_lists(2).indices, _T(), users=torch.tensor(
        [0, 1], device="meta")), ValueError, r"users"),
    # without users=, the too-few-rows refusal now names users=
    Case("too-few-rows-hint", lambda: ranking_metrics(_lists(4).indices, _T()), ValueError,
         r"^top must have a row for every test user \(row u: user index u's list\), so at "
         r"least 6 rows, got 4; or pass users= \(row j: user users\[j\]'s list\)$"),
    Case("item-twice-names-the-user", lambda: ranking_metrics(
        torch.tensor([[0, 1], [2, 2]]), _T().subset(_T().user <= 1), users=[1, 0]), ValueError,
         r"^top must list an item once a row: user 0's list holds item 2 twice$"),
]


# the fix a refusal names works, whatever form rows / users were given in
FIX_FORMS = [("list", lambda i: [i]), ("tuple", lambda i: (i,)),
             ("range", lambda i: range(i, i + 1)), ("numpy", lambda i: np.array([i])),
             ("tensor", lambda i: torch.tensor([i])),
             ("int32", lambda i: torch.tensor([i], dtype=torch.int32))]


@pytest.mark.parametrize("name, form", FIX_FORMS, ids=[f[0] for f in FIX_FORMS])
def test_the_named_fix_works(name, form):
    ratings, rows = _small(), form(3)
    with pytest.raises(ValueError, match=r"select the ratings of rows first: ") as info:
        rating_matrix(ratings, "user", rows=rows)
    fix = str(info.value).split("rows first: ", 1)[1]
    fixed = eval(fix, {"torch": torch, "ratings": ratings, "rows": rows})
    m = rating_matrix(fixed, "user", rows=rows)
    assert m.shape == (1, 3) and m.to_dense().equal(_dense(ratings, "user")[[3]])
    test, lists, users = _T(), _lists(1), form(4)
    with pytest.raises(ValueError, match=r"selecting their test ratings: ") as info:
        ranking_metrics(lists, test, 2, users=users)
    fix = str(info.value).split("test ratings: ", 1)[1]
    fixed = eval(fix, {"torch": torch, "test": test, "users": users})
    assert ranking_metrics(lists, fixed, 2, users=users) == ranking_metrics(
        _padded(lists, [4], test.n_users, 4), fixed, 2)


@pytest.mark.parametrize("case", BAD_USERS, ids=lambda c: c.id)
def test_ranking_metrics_users_cases(case):
    run_case(case)


def test_failed_calls_leave_the_arguments_as_they_were():
    r = _small()
    rows = torch.tensor([3, 3])
    before = (r.user.clone(), r.item.clone(), r.rating.clone(), rows.clone())
    with pytest.raises(ValueError, match=re.escape("rows must hold each user once")):
        rating_matrix(r, "user", rows=rows)
    assert all(torch.equal(a, b) for a, b in zip(before, (r.user, r.item, r.rating, rows)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_devices():
    r = _small()
    on = dataclasses.replace(r, user=r.user.cuda(), item=r.item.cuda(), rating=r.rating.cuda())
    for rows in ([3, 1], torch.tensor([3, 1], device="cuda")):  # a list made on their device
        m = rating_matrix(on, "user", rows=rows)
        assert m.device == on.user.device
        assert torch.equal(densify(m).cpu(), densify(rating_matrix(r, "user", rows=[3, 1])))
    with pytest.raises(ValueError, match=r"^rows must be on the ratings' device cuda:0, got cpu$"):
        rating_matrix(on, "user", rows=torch.tensor([3, 1]))
    with pytest.raises(ValueError, match=r"^rows must be on the ratings' device cpu, got cuda:0$"):
        rating_matrix(r, "user", rows=torch.tensor([3, 1], device="cuda"))
    # the refusals' fixes name a tensor on the ratings' device, and work
    for rows in ([3], torch.tensor([3], device="cuda")):
        with pytest.raises(ValueError, match=r"rows first: ") as info:
            rating_matrix(on, "user", rows=rows)
        fixed = eval(str(info.value).split("rows first: ", 1)[1],
                     {"torch": torch, "ratings": on, "rows": rows})
        assert rating_matrix(fixed, "user", rows=rows).device == on.user.device
    cpu_test, few = _test_ratings(), torch.tensor([4], device="cuda")
    with pytest.raises(ValueError, match=r"test\.user, users\.to\('cpu'\)\)\)$") as info:
        ranking_metrics(_lists(1), cpu_test, 2, users=few)
    fixed = eval(str(info.value).split("test ratings: ", 1)[1],
                 {"torch": torch, "test": cpu_test, "users": few})
    assert ranking_metrics(_lists(1), fixed, 2, users=few)["users"] == 1
    # users on any device: read on the CPU; top's rows gathered on its own device
    test = _test_ratings()
    lists, users = _lists(5), torch.tensor([4, 0, 5, 2, 1])
    expected = ranking_metrics(lists, test, 3, users=users)
    top = torch.return_types.topk((lists.values.cuda(), lists.indices.cuda()))
    for where in ("cpu", "cuda"):
        assert ranking_metrics(top, test, 3, users=users.to(where)) == expected
