"""The twenty-second bad-input probe (docs/bad_inputs_probe22.md): the API added in session
23 (``user_split``, ``UserSplit``, ``rating_matrix(rows=)``, ``ranking_metrics(users=)``,
``nnsparse.Normalize``, dense labels in ``SparseRowDataset``, ``Ratings`` field
assignment, ``examples/implicit_mult_dae.py``'s flags) fed wrong inputs.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result, against a reference where there is one).
"""
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nnsparse
from nnsparse.data import (HeldOut, Ratings, Split, UserSplit, random_split, ranking_metrics,
                           rating_matrix, user_split)
from example_script import load_example as _load
from probe_cases import Case, run_case

NAN = math.nan


def _ratings() -> Ratings:  # 20 users rating the same 5 items
    return Ratings.from_triples([u for u in range(20) for _ in range(5)],
                                [i for _ in range(20) for i in range(5)], [1.] * 100)


def _held() -> Ratings:  # users 3 and 1's ratings, of the maps of 20 users
    r = _ratings()
    return r.subset(torch.isin(r.user, torch.tensor([3, 1])))


def _other() -> Ratings:  # a record of other maps (one user, one item)
    return Ratings.from_triples([0], [0], [1.])


def _same_nan(out: torch.Tensor, dense: torch.Tensor, p: float) -> bool:
    """``out`` (sparse) densified equals ``F.normalize(dense)``, NaN where it has NaN."""
    ref = F.normalize(dense, p=p, dim=1)
    got = out.to_dense()
    return bool(torch.equal(got.isnan(), ref.isnan()) and
                torch.allclose(got.nan_to_num(0.), ref.nan_to_num(0.)))


_NAN_ROWS = torch.tensor([[NAN, 1.], [2., 0.], [3., 4.]])


# -- Normalize / normalize: a row holding a NaN is NaN, as F.normalize (was: its other
#    values divided by eps, 1e12, for p = 2 and every p other than 1 and inf) ------------

NORMALIZE_CASES = [
    Case(f"normalize-nan-{form}-p{p}", lambda form=form, p=p: nnsparse.Normalize(p=p)(
        _NAN_ROWS.to_sparse_csr() if form == "csr" else _NAN_ROWS.to_sparse()),
        None, check=lambda out, p=p: _same_nan(out, _NAN_ROWS, p))
    for form in ("csr", "coo") for p in (2.0, 3.0, 0.5)
] + [
    Case("normalize-fn-nan-p2", lambda: nnsparse.normalize(_NAN_ROWS.to_sparse_csr()), None,
         check=lambda out: _same_nan(out, _NAN_ROWS, 2.0)),
]

# -- rows= and users=: an index beyond int64 is out of range (a ValueError naming it), not a
#    wrong kind; a numpy uint64 one is not wrapped to a negative index ----------------------

ROWS_CASES = [
    Case("rows-list-2**63", lambda: rating_matrix(_held(), "user", rows=[3, 1, 2 ** 63]),
         ValueError, re.escape("rows must be user indices in [0, 20), got 9223372036854775808")),
    Case("rows-list-2**64", lambda: rating_matrix(_held(), "user", rows=[3, 2 ** 64]),
         ValueError, re.escape("rows must be user indices in [0, 20), got 18446744073709551616")),
    Case("rows-list-np-uint64", lambda: rating_matrix(_held(), "user",
                                                      rows=[np.uint64(2 ** 63), 1]),
         ValueError, re.escape("rows must be user indices in [0, 20), got 9223372036854775808")),
    Case("rows-np-uint64-array", lambda: rating_matrix(
        _held(), "user", rows=np.array([3, 2 ** 64 - 1], dtype=np.uint64)),
         ValueError, re.escape("rows must be user indices in [0, 20), got 18446744073709551615")),
    Case("users-list-2**63", lambda: ranking_metrics(torch.arange(5).repeat(2, 1), _held(), 2,
                                                     users=[3, 2 ** 63]),
         ValueError, re.escape("users must be user indices in [0, 20), got 9223372036854775808")),
    Case("users-np-uint64-array", lambda: ranking_metrics(
        torch.arange(5).repeat(2, 1), _held(), 2,
        users=np.array([3, 2 ** 63], dtype=np.uint64)),
         ValueError, re.escape("users must be user indices in [0, 20), got 9223372036854775808")),
    # still a TypeError: a wrong kind
    Case("rows-list-mixed", lambda: rating_matrix(_held(), "user", rows=[3, "a"]), TypeError,
         re.escape("rows must be a 1-D integer tensor or a sequence of ints (user indices), "
                   "got list [3, 'a']")),
    Case("rows-np-uint64-ok", lambda: rating_matrix(
        _held(), "user", rows=np.array([3, 1], dtype=np.uint64)).to_dense(), None,
         check=lambda out: torch.equal(out, torch.ones(2, 5))),
]

# -- UserSplit: the parts share train's id maps; a field assigned later is checked --------

SPLIT_CASES = [
    Case("UserSplit-other-user-map", lambda: UserSplit(_ratings(), (_held(), _held()),
                                                       (_other(), _held())),
         ValueError, re.escape("test fold_in must share train's user_map (the parts of one "
                               "split), got one of 1 users for their 20")),
    Case("UserSplit-other-item-map", lambda: UserSplit(
        _ratings(), (_held(), Ratings.from_triples(list(range(20)), [0] * 20, [1.] * 20)),
        (_held(), _held())),
         ValueError, re.escape("validation target must share train's item_map (the parts of "
                               "one split), got one of 1 items for their 5")),
    Case("UserSplit-equal-maps-ok", lambda: UserSplit(_ratings(), (_held(), _held()),
                                                      (_held(), _held())), None,
         check=lambda s: type(s.test) is HeldOut),
]


def _assigned(field, value, make=lambda: user_split(_ratings(), test=2, validation=2, seed=0)):
    split = make()
    before = {name: getattr(split, name) for name in ("train", "validation", "test")}
    try:
        setattr(split, field, value)
    finally:  # a refused assignment leaves the split as it was
        assert all(getattr(split, name) is part for name, part in before.items())
    return split


ASSIGN_CASES = [
    Case("assign-validation-None", lambda: _assigned("validation", None), TypeError,
         re.escape("validation must be a (fold_in, target) pair of Ratings, got NoneType")),
    Case("assign-test-str-target", lambda: _assigned("test", (_held(), "x")), TypeError,
         re.escape("test target must be a Ratings record")),
    Case("assign-test-other-maps", lambda: _assigned("test", (_other(), _other())), ValueError,
         re.escape("test fold_in must share train's user_map")),
    Case("assign-train-None", lambda: _assigned("train", None), TypeError,
         re.escape("train must be a Ratings record")),
    Case("assign-train-other-maps", lambda: _assigned("train", _other()), ValueError,
         re.escape("train must share the held-out parts' user_map (the parts of one split), "
                   "got one of 1 users for their 20")),
]


def _assign_pair_makes_held_out():
    split = user_split(_ratings(), test=2, validation=2, seed=0)
    split.validation = (split.test.fold_in, split.test.target)
    return split


ASSIGN_CASES.append(Case("assign-pair-ok", _assign_pair_makes_held_out, None,
                         check=lambda s: type(s.validation) is HeldOut
                         and s.validation.fold_in is s.test.fold_in))

# -- Split (random_split's, holdout_split's record): the same checks as UserSplit's (was:
#    parts on other maps accepted, a field assigned later not checked) ---------------------

PLAIN_SPLIT_CASES = [
    Case("Split-other-user-map", lambda: Split(_ratings(), _held(), _other()), ValueError,
         re.escape("test must share train's user_map (the parts of one split), "
                   "got one of 1 users for their 20")),
    Case("Split-other-item-map", lambda: Split(
        _ratings(), Ratings.from_triples(list(range(20)), [0] * 20, [1.] * 20), _held()),
         ValueError, re.escape("validation must share train's item_map (the parts of one "
                               "split), got one of 1 items for their 5")),
    Case("Split-other-ids", lambda: Split(_ratings(), _held(), Ratings.from_triples(
        [u + 100 for u in range(20)], [0] * 20, [1.] * 20).subset([0])),
         ValueError, re.escape("got one of 20 users for their 20, with other ids")),
    Case("Split-equal-maps-ok", lambda: Split(_ratings(), _held(), _held()), None,
         check=lambda s: len(s.test) == 10),
]


def _assigned_plain(field, value):
    return _assigned(field, value, lambda: random_split(_ratings(), test=0.1, validation=0.1,
                                                       seed=0))


PLAIN_SPLIT_CASES += [
    Case("Split-assign-test-None", lambda: _assigned_plain("test", None), TypeError,
         re.escape("test must be a Ratings record")),
    Case("Split-assign-validation-pair", lambda: _assigned_plain("validation", (_held(),)),
         TypeError, re.escape("validation must be a Ratings record")),
    Case("Split-assign-test-other-maps", lambda: _assigned_plain("test", _other()), ValueError,
         re.escape("test must share train's user_map (the parts of one split), "
                   "got one of 1 users for their 20")),
    Case("Split-assign-train-other-maps", lambda: _assigned_plain("train", _other()),
         ValueError, re.escape("train must share the other parts' user_map (the parts of one "
                               "split), got one of 1 users for their 20")),
]


def _assign_plain_ok():
    split = random_split(_ratings(), test=0.1, validation=0.1, seed=0)
    held = _held()
    split.test = held
    split.train = split.train.subset([0, 1])
    return split, held


PLAIN_SPLIT_CASES.append(Case("Split-assign-ok", _assign_plain_ok, None,
                              check=lambda out: out[0].test is out[1]
                              and len(out[0].train) == 2))

CASES = NORMALIZE_CASES + ROWS_CASES + SPLIT_CASES + ASSIGN_CASES + PLAIN_SPLIT_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_probe22(case):
    run_case(case)


# -- implicit_mult_dae.py: an int flag beyond int64 refused by the parser (was a traceback
#    from the library, exit status 1) -------------------------------------------------------

@pytest.mark.parametrize("flag", ["--hidden", "--threads", "--batch-size"])
def test_mult_dae_int_flag_beyond_int64(capsys, flag):
    with pytest.raises(SystemExit) as exit:
        _load("implicit_mult_dae").main(["--no-progress", flag, str(2 ** 63)])
    assert exit.value.code == 2
    assert f"{flag} must be below 2**63, got {2 ** 63}" in capsys.readouterr().err
