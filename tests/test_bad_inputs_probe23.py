"""The twenty-third bad-input probe (docs/bad_inputs_probe23.md): session 23's API again
(``user_split``, ``UserSplit``/``Split``, ``rating_matrix(rows=)``,
``ranking_metrics(users=)``, dense labels in ``SparseRowDataset``,
``examples/implicit_mult_dae.py``'s flags), on the inputs probe 22 left untried.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).
"""
import os
import re

import numpy as np
import pytest
import torch

from nnsparse.data import (Ratings, SparseRowDataset, random_split, ranking_metrics,
                           rating_matrix, user_split)
from example_script import load_example as _load
from probe_cases import Case, run_case


def _ratings() -> Ratings:  # 20 users rating the same 5 items
    return Ratings.from_triples([u for u in range(20) for _ in range(5)],
                                [i for _ in range(20) for i in range(5)], [1.] * 100)


def _held() -> Ratings:  # users 3 and 1's ratings, of the maps of 20 users
    r = _ratings()
    return r.subset(torch.isin(r.user, torch.tensor([3, 1])))


def _users(part: Ratings) -> int:
    return len(torch.unique(part.user))


def _edited(index: int, value: int) -> Ratings:  # a user index edited in place, past checks
    r = _ratings()
    r.user[index] = value
    return r


# -- user_split: two fractions leave a training user (was: test=0.98 of 20 users rounded up
#    to all 20, an empty train); a user index edited out of its map refused by name (was
#    bincount's RuntimeError or an IndexError naming nothing) -----------------------------

USER_SPLIT_CASES = [
    Case("user_split-fractions-test-0.98", lambda: user_split(_ratings(), test=0.98,
                                                             validation=0.0, seed=0), None,
         check=lambda s: (_users(s.train), _users(s.test.fold_in)) == (1, 19)),
    Case("user_split-fractions-test-0.999", lambda: user_split(_ratings(), test=0.999,
                                                              validation=0.0, seed=0), None,
         check=lambda s: _users(s.train) == 1),
    Case("user_split-fractions-one-user", lambda: user_split(
        Ratings.from_triples([0, 0, 0], [0, 1, 2], [1.] * 3), test=0.6, validation=0.2), None,
         check=lambda s: len(s.train) == 3 and len(s.test.fold_in) == 0),
    # controls: counts are taken as asked; fractions that round below every user unchanged
    Case("user_split-counts-all-ok", lambda: user_split(_ratings(), test=20, validation=0),
         None, check=lambda s: len(s.train) == 0 and _users(s.test.target) == 20),
    Case("user_split-fractions-0.5-0.49-ok", lambda: user_split(_ratings(), test=0.5,
                                                               validation=0.49, seed=0), None,
         check=lambda s: (_users(s.train), _users(s.validation.fold_in),
                          _users(s.test.fold_in)) == (1, 9, 10)),
    Case("user_split-edited-user-negative", lambda: user_split(_edited(0, -1)), ValueError,
         re.escape("ratings.user indices must be non-negative, got min -1")),
    Case("user_split-edited-user-beyond-map", lambda: user_split(_edited(0, 25)), ValueError,
         re.escape("ratings.user indices must be in [0, 20), got max 25")),
]


# -- Split / UserSplit: a field cannot be deleted (was: del split.test let every later
#    assignment in unchecked, split.validation = None included) --------------------------

def _deleted(make, field):
    split = make()
    before = {name: getattr(split, name) for name in ("train", "validation", "test")}
    try:
        delattr(split, field)
    finally:  # the refused delete leaves the split as it was, its checks still on
        assert all(getattr(split, name) is part for name, part in before.items())
        with pytest.raises(TypeError, match="validation must be"):
            split.validation = None


def _user_split():
    return user_split(_ratings(), test=2, validation=2, seed=0)


def _plain_split():
    return random_split(_ratings(), test=0.1, validation=0.1, seed=0)


def _other_attribute_deleted():
    split = _user_split()
    split.note = "mine"
    del split.note
    return split


DELETE_CASES = [
    Case("UserSplit-del-test", lambda: _deleted(_user_split, "test"), AttributeError,
         re.escape("cannot delete UserSplit.test: a split keeps its three parts (assign a "
                   "new test instead)")),
    Case("UserSplit-del-train", lambda: _deleted(_user_split, "train"), AttributeError,
         re.escape("cannot delete UserSplit.train")),
    Case("Split-del-test", lambda: _deleted(_plain_split, "test"), AttributeError,
         re.escape("cannot delete Split.test: a split keeps its three parts")),
    Case("UserSplit-del-other-ok", _other_attribute_deleted, None,
         check=lambda s: not hasattr(s, "note")),
]


# -- rows= and users=: a torch.uint64 index of 2**63 or more named as it is (was wrapped to
#    a negative index, "got -9223372036854775808"); a bool among a list's ints refused (was
#    read as 1: user 1's row); a bytearray refused as bytes is -----------------------------

_TOP = torch.arange(5).repeat(2, 1)
_UINT64_HUGE = torch.tensor([3, 2 ** 63], dtype=torch.uint64)

ROWS_CASES = [
    Case("rows-uint64-tensor-2**63", lambda: rating_matrix(_held(), "user", rows=_UINT64_HUGE),
         ValueError, re.escape("rows must be user indices in [0, 20), got 9223372036854775808")),
    Case("users-uint64-tensor-2**63", lambda: ranking_metrics(_TOP, _held(), 2,
                                                              users=_UINT64_HUGE),
         ValueError, re.escape("users must be user indices in [0, 20), got 9223372036854775808")),
    Case("rows-list-int-and-bool", lambda: rating_matrix(_held(), "user", rows=[3, True]),
         TypeError, re.escape("rows must hold integer user indices, got rows[1] = True, a bool")),
    Case("rows-list-np-bool", lambda: rating_matrix(_held(), "user",
                                                    rows=[np.int64(3), np.True_]),
         TypeError, re.escape("rows must hold integer user indices, got rows[1] = np.True_, "
                              "a bool")),
    Case("users-tuple-bool-tensor", lambda: ranking_metrics(
        _TOP, _held(), 2, users=(torch.tensor(3), torch.tensor(True))),
         TypeError, re.escape("users must hold integer user indices, got users[1] = "
                              "tensor(True), a bool")),
    Case("rows-bytearray", lambda: rating_matrix(_held(), "user", rows=bytearray(b"\x03\x01")),
         TypeError, re.escape("rows must be a 1-D integer tensor or a sequence of ints (user "
                              "indices), got bytearray")),
    # controls: a list of bools only is a mask (its fix given); a uint64 tensor in range works
    Case("rows-list-all-bools", lambda: rating_matrix(_held(), "user", rows=[True, False]),
         TypeError, re.escape("got dtype torch.bool; for the users of a mask, pass "
                              "mask.nonzero().squeeze(1)")),
    Case("rows-uint64-tensor-ok", lambda: rating_matrix(
        _held(), "user", rows=torch.tensor([3, 1], dtype=torch.uint64)).to_dense(), None,
         check=lambda out: torch.equal(out, torch.ones(2, 5))),
    # Ratings.subset shares the rule (was: subset([3, True]) kept entries 3 and 1); its
    # list of bools only is a mask, as before
    Case("subset-list-int-and-bool", lambda: _ratings().subset([3, True]), TypeError,
         re.escape("index must hold integer entry indices or bools only (a mask), got "
                   "index[1] = True, a bool")),
    Case("subset-tuple-np-bool-first", lambda: _ratings().subset((np.False_, 2)), TypeError,
         re.escape("got index[0] = np.False_, a bool")),
    Case("subset-list-all-bools-ok", lambda: _ratings().subset([i % 50 == 3 for i in range(100)]),
         None, check=lambda part: part.item.tolist() == [3, 3]),
]


# -- dense labels: a nested tensor target refused by name (was torch's "Internal error:
#    NestedTensorImpl doesn't support sizes") ------------------------------------------

_X = torch.eye(4).to_sparse_csr()

LABELS_CASES = [
    Case("labels-nested", lambda: SparseRowDataset(_X, torch.nested.nested_tensor(
        [torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(1)])), TypeError,
         re.escape("target must be a 2-D sparse CSR or COO tensor or a dense tensor of labels, "
                   "got a nested tensor; pad it (torch.nested.to_padded_tensor)")),
]

CASES = USER_SPLIT_CASES + DELETE_CASES + ROWS_CASES + LABELS_CASES


def test_ids_distinct():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_probe23(case):
    run_case(case)


# -- implicit_mult_dae.py: --threads bounded (100000 crashed the process, SIGSEGV, no
#    message); --hidden beyond the machine's memory refused (was torch's allocation
#    traceback) ------------------------------------------------------------------------

_SMALL = ["--no-progress", "--synthetic-users", "50", "--synthetic-items", "40",
          "--synthetic-ratings", "1000", "--epochs", "1"]


@pytest.mark.parametrize("flags, message", [
    (["--threads", "100000"], "--threads must be at most "),
    (["--hidden", str(2 ** 60)], f"--hidden {2 ** 60} of 40 items needs about "),
], ids=["threads-100000", "hidden-2**60"])
def test_mult_dae_flags_beyond_the_machine(capsys, flags, message):
    if "--hidden" in flags and not hasattr(os, "sysconf"):
        pytest.skip("the memory check reads the POSIX sysconf; this system has none")
    with pytest.raises(SystemExit) as exit:
        _load("implicit_mult_dae").main(_SMALL + flags)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# -- movielens_autoencoder.py: --hidden beyond the machine's memory refused, its network
#    counted on the meta device (was torch's allocation traceback, as Mult-DAE's was) -------

@pytest.mark.parametrize("flags, message", [
    (["--model", "autorec"], f"--hidden {2 ** 40} of --model autorec on 1682 x 943 (item "
                             f"rows) needs about 3.09e+07 GiB to train"),
    (["--model", "sparsefc"], f"--hidden {2 ** 40} of --model sparsefc on 1682 x 943 (item "
                              f"rows) needs more than 2**63 bytes to train"),
], ids=["autorec", "sparsefc-overflow"])
@pytest.mark.skipif(not hasattr(os, "sysconf"),
                    reason="the memory check reads the POSIX sysconf; this system has none")
def test_movielens_hidden_beyond_the_machine(capsys, flags, message):
    with pytest.raises(SystemExit) as exit:
        _load("movielens_autoencoder").main(["--no-progress", "--epochs", "1", "--hidden",
                                             str(2 ** 40)] + flags)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "choose a smaller --hidden" in err and "Traceback" not in err


def test_movielens_hidden_that_fits_trains_as_without_the_check(monkeypatch):
    # the check builds the model's layers on the meta device only: a --hidden that fits
    # is not refused, and trains as without the check
    module = _load("movielens_autoencoder")
    args = ["--no-progress", "--model", "autorec", "--hidden", "20", "--epochs", "2",
            "--threads", "1"]
    checked = module.main(args)
    monkeypatch.setattr(module, "check_memory", lambda *args: None)
    unchecked = module.main(args)
    assert checked["test_rmse"] == unchecked["test_rmse"]
    assert [e["train_loss"] for e in checked["epochs"]] == \
        [e["train_loss"] for e in unchecked["epochs"]]
