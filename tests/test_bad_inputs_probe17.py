"""The seventeenth probe (docs/bad_inputs_probe17.md): what changed on the day of session 19,
``RatingModel.evaluate_ranking``, ``sparse_grad=True`` layers with non-leaf weights, the
loads' checks and the ``is_real`` number checks, given wrong, odd and extreme inputs.

Defects found and fixed (rows marked "was:"):

* a real number beyond float's range (an int from ``2**1024``, such a ``Fraction``) passed
  ``is_real`` and then failed with float()'s ``OverflowError: int too large to convert to
  float`` (no argument named): the models' hyperparameters, ``Trainer``'s ``lr`` and
  ``weight_decay`` (at the constructor's last line), ``evaluate_ranking``'s ``threshold``,
  the optimisers' ``lr`` (at the first step), the optimiser state's ``step``, synthetic noise,
  the normaliser's scale, the criteria's numbers, ``clip_grad_norm_``'s ``max_norm`` (now
  torch's inf), ``recommend``'s ``shrinkage`` and ``DynamicSparseTensor``'s ``mult_coef``
  (past their checks).  Now refused as not finite, by name;
* a loaded (pickled) model's ``global_mean`` was checked with ``numbers.Real``: a numpy
  ``timedelta64`` passed (read as its count), 10**400 raised ``OverflowError``, and a
  ``Fraction`` passed, to fail at the first prediction inside ``torch.full``;
* ``Batchifier(device='meta')`` (and a loaded one) was taken, to fail at the call inside
  torch ("Could not run 'aten::addmm.out' ... 'SparseCsrMeta' backend");
* a ``SparseLinearBatch(sparse_grad=True)`` in a torch container whose ``weight_t`` is
  pruned or parametrized, given a state holding ``weight``, reported the unexpected key
  as ``weight_t``, a key the caller never gave (message and ``unexpected_keys``);
* the example, given ``--train``/``--test`` files sharing (user, item) pairs (which
  ``read_split`` only warns of), trained, printed the RMSE, then died with a traceback in the
  ranking; now it ranks the test ratings less those pairs, or skips the ranking, with a
  printed (and recorded) note saying how many were left out and why.
"""
import json
import math
import pickle
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import nnsparse
from nnsparse import Batchifier, SDAESparseCriterion, SparseLinearBatch
from nnsparse.builder import DynamicSparseTensor
from nnsparse.data import RatingNormalizer, split_ratings, synthetic_ratings
from nnsparse.models import AutoRec, Trainer
from probe_cases import Case, run_case

HUGE = 10 ** 400                   # an int float() cannot hold
HUGE_FRACTION = Fraction(HUGE, 3)  # a Fraction float() cannot hold
HUGE_TEXT = r"got (Fraction\()?-?1000000000"  # (the number is shown as given, not as inf)


@pytest.fixture(scope="module")
def fitted():
    torch.manual_seed(0)
    train, test = split_ratings(synthetic_ratings(0, 30, 20, 300), 0.2, seed=0)
    model = AutoRec(hidden=4, epochs=1, validation_ratio=0.0)
    return model.fit(train, verbose=False, progress=False), train, test


def _lazy_adam_step(lr: Any) -> Any:
    layer = nn.Linear(2, 2)
    opt = nnsparse.optim.LazyAdam(layer.parameters(), lr=lr)
    layer(torch.ones(1, 2)).sum().backward()
    opt.step()


def _adam_state_step(step: Any) -> Any:
    layer = nn.Linear(2, 2)
    opt = nnsparse.optim.LazyAdam(layer.parameters())
    layer(torch.ones(1, 2)).sum().backward()
    opt.step()
    state = opt.state_dict()
    state["state"][0]["step"] = step
    opt.load_state_dict(state)


# -- numbers beyond float's range -------------------------------------------------------------

HUGE_CASES = [
    # was: OverflowError: int too large to convert to float
    *[Case(f"AutoRec-{key}-{label}", lambda m, key=key, v=v: AutoRec(**{key: v}), ValueError,
           rf"^{key} must be finite, {HUGE_TEXT}")
      for key in ("lr", "l2", "validation_ratio", "weight_decay")
      for label, v in (("int", HUGE), ("negative", -HUGE), ("fraction", HUGE_FRACTION))],
    # was: OverflowError at the constructor's float(lr)
    Case("Trainer-lr", lambda m: Trainer(m[0], epochs=1, batch_size=8, lr=HUGE), ValueError,
         rf"^lr must be finite, {HUGE_TEXT}"),
    Case("Trainer-weight_decay", lambda m: Trainer(m[0], epochs=1, batch_size=8, lr=0.1,
                                                  weight_decay=HUGE), ValueError,
         rf"^weight_decay must be finite, {HUGE_TEXT}"),
    # was: OverflowError in math.isfinite
    Case("evaluate_ranking-threshold", lambda m: m[0].evaluate_ranking(m[2], threshold=HUGE),
         ValueError, rf"^threshold must be finite or None, {HUGE_TEXT}"),
    Case("evaluate_ranking-threshold-negative",
         lambda m: m[0].evaluate_ranking(m[2], threshold=-HUGE_FRACTION), ValueError,
         r"^threshold must be finite or None, got -1000"),
    # was: passed the check (only a float inf was refused), then OverflowError
    Case("recommend-shrinkage", lambda m: m[0].recommend(0, shrinkage=HUGE, by_index=True),
         ValueError, rf"^shrinkage must be finite, {HUGE_TEXT}"),
    Case("DynamicSparseTensor-mult_coef", lambda m: DynamicSparseTensor(mult_coef=HUGE),
         ValueError, rf"^mult_coef must be finite, {HUGE_TEXT}"),
    # was: taken, then OverflowError at the first step
    Case("LazyAdam-lr", lambda m: _lazy_adam_step(HUGE), ValueError,
         rf"lr must be finite, {HUGE_TEXT}"),
    # was: OverflowError in the state's check
    Case("LazyAdam-state-step", lambda m: _adam_state_step(HUGE), ValueError,
         r"\['step'\] must be a whole number >= 0, got 1000"),
    # was: OverflowError
    Case("synthetic_ratings-noise", lambda m: synthetic_ratings(0, 5, 5, 5, noise=HUGE),
         ValueError, rf"^noise must be non-negative and finite, {HUGE_TEXT}"),
    Case("RatingNormalizer-scale", lambda m: RatingNormalizer(m[1], "user", scale=(1, HUGE)),
         ValueError, r"^scale must be finite, got \(1.0, inf\)"),
    Case("SDAESparseCriterion-alpha",
         lambda m: SDAESparseCriterion(nn.MSELoss(), alpha=HUGE_FRACTION), ValueError,
         rf"^alpha must be finite, got 1000"),
    # kept: refused as out of range before (an int compares with floats)
    Case("split_ratings-ratio", lambda m: split_ratings(m[1], HUGE, seed=0), ValueError,
         rf"^ratio must be a number in \[0, 1\), {HUGE_TEXT}"),
    # was: OverflowError; now as torch's inf: a bound beyond every float clips nothing
    Case("clip_grad_norm_-max_norm", lambda m: nnsparse.optim.clip_grad_norm_(
        [nn.Parameter(torch.ones(2))], HUGE), None, check=lambda out: float(out) == 0.0),
    # works: a Fraction that float() holds (threshold 7/2 stars)
    Case("evaluate_ranking-threshold-fraction", lambda m: m[0].evaluate_ranking(
        m[2], threshold=Fraction(7, 2), progress=False), None,
        check=lambda out: out["users"] >= 1),
]


@pytest.mark.parametrize("case", HUGE_CASES, ids=lambda c: c.id)
def test_probe17_numbers_beyond_float(fitted, case: Case) -> None:
    run_case(case, fitted)


# -- a loaded model's global_mean -------------------------------------------------------------

def _with_global_mean(model: AutoRec, value: Any) -> AutoRec:
    state = dict(model.__getstate__())
    state["global_mean"] = value
    copy = object.__new__(AutoRec)
    copy.__setstate__(state)
    return copy


MEAN_CASES = [
    # was: taken (a timedelta64 is an Integral to numbers), read as its count
    Case("timedelta64", lambda m: _with_global_mean(m[0], np.timedelta64(3)), ValueError,
         r"global_mean must be a finite number, got np.timedelta64\(3\)"),
    # was: OverflowError in math.isfinite
    Case("huge", lambda m: _with_global_mean(m[0], HUGE), ValueError,
         rf"global_mean must be a finite number, {HUGE_TEXT}"),
    # was: taken, then "full(): argument 'fill_value' must be Number, not Fraction" at the
    # first prediction; now stored as a float, as fit stores it
    Case("fraction", lambda m: _with_global_mean(m[0], Fraction(7, 2)), None,
         check=lambda c: type(c.global_mean) is float and c.global_mean == 3.5
         and bool(torch.isfinite(c.predict_entries(torch.tensor([0]),
                                                   torch.tensor([0]))).all())),
    # (was: kept as an np.float32, which save() would pickle as one)
    Case("numpy float", lambda m: _with_global_mean(m[0], np.float32(3.5)), None,
         check=lambda c: type(c.global_mean) is float and c.global_mean == 3.5),
]


@pytest.mark.parametrize("case", MEAN_CASES, ids=lambda c: c.id)
def test_probe17_loaded_global_mean(fitted, case: Case) -> None:
    run_case(case, fitted)


# -- Batchifier on the meta device ------------------------------------------------------------

def _loaded_batchifier(device: Any) -> Batchifier:
    b = Batchifier(nn.Linear(4, 3), 3, progress=False)
    state = dict(b.__dict__, device=device)
    copy = object.__new__(Batchifier)
    copy.__setstate__(state)
    return copy


META = r"device must hold data, got 'meta'; use 'cpu' or 'cuda'"
BATCHIFIER_CASES = [
    # was: taken; the call failed inside torch ('SparseCsrMeta' backend)
    Case("constructor", lambda: Batchifier(nn.Linear(4, 3), 3, device="meta"), ValueError,
         META),
    Case("torch.device", lambda: Batchifier(nn.Linear(4, 3), 3, device=torch.device("meta")),
         ValueError, META),
    Case("loaded", lambda: _loaded_batchifier("meta"), ValueError,
         "a loaded Batchifier's settings: " + META),
    Case("assigned", lambda: _assigned_meta(), ValueError, META),
    # works: a device name is stored as a torch.device
    Case("loaded cpu", lambda: _loaded_batchifier("cpu"), None,
         check=lambda b: b.device == torch.device("cpu")
         and torch.allclose(b(torch.eye(4).to_sparse()), b.network(torch.eye(4)))),
]


def _assigned_meta() -> Any:
    b = Batchifier(nn.Linear(4, 3), 3, progress=False)
    b.device = torch.device("meta")
    return b(torch.eye(4).to_sparse())


@pytest.mark.parametrize("case", BATCHIFIER_CASES, ids=lambda c: c.id)
def test_probe17_batchifier_meta(case: Case) -> None:
    with torch.no_grad():
        run_case(case)


# -- a sparse_grad layer's load in a torch container: the key the caller gave -----------------

def _pruned_in_sequential(how: str) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(SparseLinearBatch(3, 2, sparse_grad=True))
    if how == "pruned":
        prune.l1_unstructured(model[0], "weight_t", 0.5)
    else:
        torch.nn.utils.parametrize.register_parametrization(model[0], "weight_t", nn.Identity())
    return model


@pytest.mark.parametrize("how", ["pruned", "parametrized"])
def test_probe17_unexpected_weight_named_as_given(how: str) -> None:
    torch.manual_seed(0)
    state = nn.Sequential(SparseLinearBatch(3, 2, sparse_grad=True)).state_dict()
    assert list(state) == ["0.bias", "0.weight"]
    model = _pruned_in_sequential(how)
    # was: Unexpected key(s) in state_dict: "0.weight_t".
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "0\.weight"\.'):
        model.load_state_dict(state)
    result = model.load_state_dict(state, strict=False)
    assert result.unexpected_keys == ["0.weight"]
    # a state that does hold weight_t (an internal name) is still reported as it came
    result = model.load_state_dict({"0.weight_t": torch.zeros(3, 2)}, strict=False)
    assert "0.weight_t" in result.unexpected_keys


# -- evaluate_ranking: odd but valid inputs, and a refused call leaves the model as it was ----

VALID_RANKING = [
    Case("k numpy int", lambda m: m[0].evaluate_ranking(m[2], np.int64(3), progress=False),
         None, check=lambda out: "ndcg@3" in out),
    Case("k 0-d tensor", lambda m: m[0].evaluate_ranking(m[2], torch.tensor(3),
                                                          progress=False),
         None, check=lambda out: "ndcg@3" in out),
    Case("batch_size 0-d uint8", lambda m: m[0].evaluate_ranking(
        m[2], 3, batch_size=torch.tensor(2, dtype=torch.uint8), progress=False),
        None, check=lambda out: "ndcg@3" in out),
    Case("threshold numpy float", lambda m: m[0].evaluate_ranking(
        m[2], 3, threshold=np.float32(4.0), progress=False),
        None, check=lambda out: out["users"] >= 1),
    Case("k above the items", lambda m: m[0].evaluate_ranking(m[2], 10 ** 6, progress=False),
         None, check=lambda out: out["recall@1000000"] == 1.0),
    Case("threshold 0-d tensor", lambda m: m[0].evaluate_ranking(
        m[2], threshold=torch.tensor(4.0)), TypeError,
        r"^threshold must be a real number or None, got Tensor"),
]


@pytest.mark.parametrize("case", VALID_RANKING, ids=lambda c: c.id)
def test_probe17_ranking_inputs(fitted, case: Case) -> None:
    model = fitted[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    run_case(case, fitted)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- the example: given files sharing pairs ---------------------------------------------------

def _example() -> Any:
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "movielens_autoencoder.py"
    spec = importlib.util.spec_from_file_location("movielens_autoencoder_p17", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROWS = [(u, i, 1 + (u * i) % 5) for u in range(12) for i in range(10) if (u + i) % 3]
WHY = ("their (user, item) pair is rated in --train too, and the ranking leaves each user's "
       "training items out")
# (test rows, extra arguments, the note, whether the ranking runs)
SHARED_PAIRS = [
    # two training pairs in test too. was: trained, printed the RMSE, then a ValueError
    # traceback from evaluate_ranking (then, for a day, a usage error before training)
    ("two shared", ROWS[1::2] + ROWS[:4:2], [],
     f"test ranking: 2 of the 42 test ratings left out ({WHY})", True),
    ("all shared", ROWS[:8:2], [],
     f"test ranking skipped: all 4 test ratings are left out ({WHY})", False),
    # the held-out ratings reaching the threshold are all shared ones
    ("threshold", [r for r in ROWS[1::2] if r[2] < 5] + [r for r in ROWS[::2] if r[2] == 5][:2],
     ["--rank-threshold", "5"], "test ranking skipped: 2 of the ", False),
]


@pytest.mark.parametrize("rows, extra, note, ranked", [c[1:] for c in SHARED_PAIRS],
                         ids=[c[0] for c in SHARED_PAIRS])
def test_probe17_example_train_test_sharing_pairs(tmp_path, capsys, rows, extra, note,
                                                 ranked) -> None:
    module = _example()
    for name, part in (("train.txt", ROWS[::2]), ("test.txt", rows)):
        (tmp_path / name).write_text("".join(f"{u} {i} {r}\n" for u, i, r in part))
    metrics = tmp_path / "metrics.json"
    with pytest.warns(UserWarning, match="rated in the training file too"):
        result = module.main(["--train", str(tmp_path / "train.txt"),
                              "--test", str(tmp_path / "test.txt"), "--format", "text",
                              "--epochs", "1", "--hidden", "4", "--no-progress",
                              "--metrics-out", str(metrics), *extra])
    out = capsys.readouterr().out
    lines = out.splitlines()
    # trained and evaluated on every test rating, the shared ones included
    assert "trained " in out and lines[-1].startswith("test RMSE: ")
    assert f"of {len(rows)} test ratings predicted by a mean" in out
    # the note, printed once (before the ranking line) and recorded
    assert len([line for line in lines if line.startswith(note)]) == 1
    saved = json.loads(metrics.read_text())
    assert saved["ranking_note"].startswith(note)
    assert result["ranking_note"] == saved["ranking_note"]
    if not ranked:
        assert result["ranking"] is None and saved["ranking"] is None
        assert not any(line.startswith("test ranking (") for line in lines)
        return
    rank_line = next(i for i, line in enumerate(lines) if line.startswith("test ranking ("))
    assert lines[rank_line - 1].startswith(note)
    # the ranking is that of the test ratings less the shared pairs: their users
    held_out = {u for u, i, r in rows if (u, i, r) not in ROWS[::2]}
    assert result["ranking"]["users"] == len(held_out)

def test_probe17_example_ranked_part_is_held_out() -> None:
    """The ranked part: the test ratings whose pair --train does not rate, in order."""
    from nnsparse.data import Ratings
    module = _example()
    train = Ratings.from_triples([0, 0, 1, 2], [0, 1, 1, 2], [1., 2., 3., 4.])
    test = train.subset([1, 3])  # shared
    test = Ratings(torch.cat([test.user, torch.tensor([1, 2])]),
                   torch.cat([test.item, torch.tensor([0, 1])]),
                   torch.tensor([5., 4., 3., 2.]), train.user_map, train.item_map)
    for threshold, kept, note in ((None, [2, 3], "test ranking: 2 of the 4 test ratings left "
                                   "out"), (3.0, [2, 3], "test ranking: 2 of"),
                                  (3.5, None, "test ranking skipped: 2 of the 4 test ratings "
                                   "are left out")):
        part, text = module.ranked_part(train, test, threshold)
        assert text is not None and text.startswith(note)
        if kept is None:
            assert part is None
        else:
            assert part.user.tolist() == [1, 2] and part.item.tolist() == [0, 1]
            assert part.rating.tolist() == [3., 2.]
    # no test pair rated in train: every test rating is ranked, no note
    part, text = module.ranked_part(train, test.subset([2, 3]))
    assert text is None and part.user.tolist() == [1, 2]
