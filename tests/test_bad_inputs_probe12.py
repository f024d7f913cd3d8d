"""The twelfth bad-input probe (docs/bad_inputs_probe12.md): item title files that list an
item twice, ``make_optimizer``'s ``eps=0`` with ``sparse="sparse_adam"``, and the flags of
``examples/movielens_autoencoder.py`` that passed its checks and failed later (a traceback,
exit status 1, sometimes after training; ``--threads 100000000`` crashed the process).

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).  The command-line rows expect argparse's exit
status 2, the message on stderr and no epoch trained.
"""
import importlib.util
import os
import pathlib
import re
from typing import Any, Dict, List

import pytest
import torch
from torch import nn

from probe_cases import Case, run_case
from nnsparse import SparseLinearBatch, make_optimizer
from nnsparse.data import read_ratings

# -- title files that list an item twice -----------------------------------------------------

_RATINGS = {"ml-1m": ("ratings.dat", "1::1::5::0\n1::2::3::0\n"),
            "ml-100k": ("u.data", "1\t1\t5\t0\n1\t2\t3\t0\n"),
            "csv": ("ratings.csv", "userId,movieId,rating,timestamp\n1,1,5,0\n1,2,3,0\n")}
_TITLES = {"ml-1m": ("movies.dat", "1::A (1995)::Drama\n2::B (1996)::Comedy\n"),
           "ml-100k": ("u.item", "1|A (1995)|01-Jan-1995||\n2|B (1996)|01-Jan-1996||\n"),
           "csv": ("movies.csv", "movieId,title,genres\n1,A (1995),Drama\n2,B (1996),Comedy\n")}
_AGAIN = {"ml-1m": "1::C (1997)::Drama\n", "ml-100k": "1|C (1997)|01-Jan-1997||\n",
          "csv": "1,C (1997),Drama\n"}


def _read_titled(tmp_path: Any, format: str, twice: bool, **kwargs: Any) -> Any:
    """``read_ratings`` of a two-item file whose title file lists item 1 a second time
    (``twice``); a refused read leaves the given ``item_map`` as it was."""
    name, text = _RATINGS[format]
    (tmp_path / name).write_text(text)
    title_name, titles = _TITLES[format]
    (tmp_path / title_name).write_text(titles + (_AGAIN[format] if twice else ""),
                                       encoding="latin-1")
    item_map = {7: 0}
    try:
        return read_ratings(tmp_path / name, format, item_map=item_map, **kwargs)
    except ValueError:
        assert item_map == {7: 0}
        raise


READER_CASES = [
    # the last line's title was kept without a word (the feature files refuse a second line)
    Case("titles_item_twice_ml1m", lambda d: _read_titled(d, "ml-1m", True), ValueError,
         r"movies.dat, line 3: the item id 1 is listed again \(first on line 1\); an item file "
         r"gives each item one title: fix the file, or pass titles=False"),
    Case("titles_item_twice_ml100k", lambda d: _read_titled(d, "ml-100k", True), ValueError,
         r"u.item, line 3: the item id 1 is listed again \(first on line 1\)"),
    Case("titles_item_twice_csv", lambda d: _read_titled(d, "csv", True), ValueError,
         r"movies.csv, line 4: the item id 1 is listed again \(first on line 2\)"),
    Case("titles_item_twice_titles_false_reads",
         lambda d: _read_titled(d, "ml-1m", True, titles=False), None,
         check=lambda r: r.titles is None and len(r) == 2),
    Case("titles_each_item_once_works", lambda d: _read_titled(d, "csv", False), None,
         check=lambda r: r.titles == ["item 7", "A (1995)", "B (1996)"]),
]


@pytest.mark.parametrize("case", READER_CASES, ids=lambda c: c.id)
def test_probe12_readers(case: Case, tmp_path: Any) -> None:
    run_case(case, tmp_path)


# -- SparseRowDataset.collate: items of a dataset with a target, and back ------------------

def _datasets() -> Any:
    from nnsparse.data import SparseRowDataset
    x = torch.tensor([[1., 0., 2., 0.], [0., 3., 0., 0.], [0., 0., 0., 4.]]).to_sparse_csr()
    return SparseRowDataset(x), SparseRowDataset(x, x)


DATASET_CASES = [
    # the item's target was dropped without a word: a batch with target None
    Case("collate_target_items_into_dataset_without_target",
         lambda: (lambda plain, with_target: plain.collate([with_target[0]]))(*_datasets()),
         TypeError, r"items must be a list of this dataset's items, \(row, row_data\) tuples as "
                    r"dataset\[i\] returns, got items\[0\] = tuple \(int, SparseRow, SparseRow\): "
                    r"an item with a target, which this dataset \(built without one\) would "
                    r"drop; collate it with the dataset it came from"),
    Case("collate_items_without_target_into_target_dataset",
         lambda: (lambda plain, with_target: with_target.collate([with_target[0], plain[1]]))(
             *_datasets()),
         TypeError, r"got items\[1\] = tuple \(int, SparseRow\): an item without a target, "
                    r"which this dataset's batches need"),
    # the message named the list ("got list"), not the item at fault
    Case("collate_item_with_a_number_for_target",
         lambda: (lambda plain, with_target: with_target.collate([(0, plain[0][1], 1)]))(
             *_datasets()),
         TypeError, r"\(row, input, target\) tuples as dataset\[i\] returns, got items\[0\] = "
                    r"tuple \(int, SparseRow, int\)$"),
    Case("collate_own_items_work",
         lambda: (lambda plain, with_target: with_target.collate([with_target[2], with_target[0]]))(
             *_datasets()), None,
         check=lambda b: b.row_index.tolist() == [2, 0] and b.target is not None),
    Case("collate_items_as_lists_work",  # as a pickled item may come back
         lambda: (lambda plain, with_target: plain.collate([list(plain[1])]))(*_datasets()), None,
         check=lambda b: b.row_index.tolist() == [1] and b.target is None),
]


@pytest.mark.parametrize("case", DATASET_CASES, ids=lambda c: c.id)
def test_probe12_dataset(case: Case) -> None:
    run_case(case)


# -- Trainer.fit: a validate() that returns a score, not an RMSE ---------------------------

def _fit_validated(*scores: Any) -> Any:
    """``Trainer.fit`` of a trainer that does not train, ``validate`` returning ``scores``."""
    from nnsparse.models import Trainer

    class NoTraining(Trainer):
        def run_epoch(self, loader: Any, optimizer: Any, epoch: int) -> float:
            return 0.0

    left = iter(scores)
    return NoTraining(nn.Linear(1, 1), epochs=len(scores), batch_size=1, lr=0.1,
                      log=None).fit(torch.eye(2).to_sparse_csr(), validate=lambda: next(left))


TRAINER_CASES = [
    # -0.9, -0.5: the epoch of -0.9 (the worst score where higher is better) was kept
    Case("validate_returns_negative_score", lambda: _fit_validated(-0.9, -0.5), ValueError,
         r"validate must return the validation RMSE \(non-negative, lower is better\), got "
         r"-0.9; a score where higher is better would make fit keep the worst epoch"),
    Case("validate_returns_negative_tensor", lambda: _fit_validated(torch.tensor([-1.0])),
         ValueError, r"validate must return the validation RMSE \(non-negative"),
    Case("validate_returns_zero_works", lambda: _fit_validated(0.5, 0.0), None,
         check=lambda r: (r.best_epoch, r.best_rmse) == (2, 0.0)),
    Case("validate_returns_inf_is_a_diverged_epoch", lambda: _fit_validated(0.5, float("inf")),
         None, check=lambda r: (r.best_epoch, r.best_rmse) == (1, 0.5)),
    # beyond float's range: inf, as real_float reads every other number (was: OverflowError)
    Case("validate_returns_huge_int_is_a_diverged_epoch", lambda: _fit_validated(0.5, 10 ** 400),
         None, check=lambda r: (r.best_epoch, r.best_rmse) == (1, 0.5)),
]


@pytest.mark.parametrize("case", TRAINER_CASES, ids=lambda c: c.id)
def test_probe12_trainer(case: Case) -> None:
    run_case(case)


# -- nnsparse.distributed.DistributedDataParallel: an argument torch's DDP lacks -------------

def _ddp(*args: Any, **kwargs: Any) -> Any:
    from nnsparse.distributed import DistributedDataParallel
    return DistributedDataParallel(nn.Linear(2, 2), *args, **kwargs)


DISTRIBUTED_CASES = [
    # inspect's bare "got an unexpected keyword argument 'bogus'", from Signature.bind
    Case("ddp_unknown_keyword", lambda: _ddp(bogus=1), TypeError,
         r"DistributedDataParallel takes torch's arguments \(module, then device_ids, "
         r"output_device, .*\): got an unexpected keyword argument 'bogus'"),
    Case("ddp_too_many_positional", lambda: _ddp(*[None] * 40), TypeError,
         r"DistributedDataParallel takes torch's arguments .*: too many positional arguments"),
    # torch's arguments still reach the process-group check (none in this process)
    Case("ddp_known_keyword_without_group", lambda: _ddp(device_ids=None), RuntimeError,
         r"DistributedDataParallel needs a process group"),
]


@pytest.mark.parametrize("case", DISTRIBUTED_CASES, ids=lambda c: c.id)
def test_probe12_distributed(case: Case) -> None:
    run_case(case)


# -- file objects torch.save / torch.load cannot use ---------------------------------------

_FITTED: Dict[str, Any] = {}


def _fitted() -> Any:
    """A small fitted AutoRec (one per test session)."""
    if not _FITTED:
        from nnsparse.data import synthetic_ratings
        from nnsparse.models import AutoRec
        ratings = synthetic_ratings(n_users=12, n_items=10, n_ratings=60, rank=2)
        _FITTED["model"] = AutoRec(hidden=2, epochs=1, batch_size=8, patience=0).fit(
            ratings, verbose=False, progress=False)
    return _FITTED["model"]


def _save_to(d: Any, mode: str, close: bool = False, saver: str = "model") -> Any:
    """Save to ``d / 'm.pt'`` opened with ``mode`` (``close``: closed first); a refused
    save leaves the file as it was (``mode`` 'rb' reads a file saved beforehand)."""
    from nnsparse import distributed
    path = d / "m.pt"
    _fitted().save(path)
    before = path.read_bytes()
    f = open(path, mode)
    try:
        if close:
            f.close()
        if saver == "model":
            _fitted().save(f)
        else:
            distributed.save({"a": 1}, f)
    finally:
        f.close()
        if mode in ("rb", "r"):
            assert path.read_bytes() == before
    return path.read_bytes()


def _load_from(d: Any, mode: str, close: bool = False) -> Any:
    from nnsparse.models import RatingModel
    path = d / "m.pt"
    _fitted().save(path)
    f = open(path, mode)
    try:
        if close:
            f.close()
        return RatingModel.load(f)
    finally:
        f.close()


FILE_CASES = [
    # torch.save's "write() argument must be str, not memoryview"
    Case("save_to_text_file", lambda d: _save_to(d, "r"), TypeError,
         r"path must be a binary file object \(open\(..., 'wb'\), io.BytesIO\), got a text one "
         r"\(TextIOWrapper\): torch writes bytes"),
    Case("save_to_string_io", lambda d: _fitted().save(__import__("io").StringIO()), TypeError,
         r"path must be a binary file object .*got a text one \(StringIO\)"),
    # torch.save's bare "write" (io.UnsupportedOperation)
    Case("save_to_file_open_for_reading", lambda d: _save_to(d, "rb"), ValueError,
         r"path must be a file object open to write \(open\(..., 'wb'\)\), got one that is not "
         r"\(mode 'rb'\)"),
    # torch.save's "write to closed file"
    Case("save_to_closed_file", lambda d: _save_to(d, "wb", close=True), ValueError,
         r"path is a closed file object \(BufferedWriter\); open it again to write"),
    Case("distributed_save_to_text_file", lambda d: _save_to(d, "r", saver="distributed"),
         TypeError, r"path must be a binary file object"),
    Case("distributed_save_to_closed_file",
         lambda d: _save_to(d, "wb", close=True, saver="distributed"), ValueError,
         r"path is a closed file object \(BufferedWriter\)"),
    # load: "... is not a model saved by nnsparse.models (RatingModel.save): UnicodeDecodeError",
    # "... : ValueError: I/O operation on closed file", torch's bare "read"
    Case("load_from_text_file", lambda d: _load_from(d, "r"), TypeError,
         r"path must be a binary file object \(open\(..., 'rb'\), io.BytesIO\), got a text one "
         r"\(TextIOWrapper\): torch reads bytes"),
    Case("load_from_closed_file", lambda d: _load_from(d, "rb", close=True), ValueError,
         r"path is a closed file object \(BufferedReader\); open it again to read"),
    Case("load_from_file_open_for_writing", lambda d: _load_from(d, "ab"), ValueError,
         r"path must be a file object open to read \(open\(..., 'rb'\)\), got one that is not "
         r"\(mode 'ab'\)"),
    Case("save_and_load_binary_file_objects_work",
         lambda d: (_save_to(d, "wb"), _load_from(d, "rb"))[1], None,
         check=lambda m: torch.equal(m.decoder.weight, _fitted().decoder.weight)),
]


@pytest.mark.parametrize("case", FILE_CASES, ids=lambda c: c.id)
def test_probe12_file_objects(case: Case, tmp_path: Any) -> None:
    run_case(case, tmp_path)


# -- Batchifier: a network that returns something else than a tensor ------------------------

class _Returns(nn.Module):
    """A network whose output is ``make(rows)``."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make, self.scale = make, nn.Parameter(torch.ones(1))

    def forward(self, x: Any) -> Any:
        return self.make(x.shape[0])


def _batchified(make: Any, top: bool = False) -> Any:
    from nnsparse import Batchifier
    run = Batchifier(_Returns(make), 3, batch_size=2, progress=False)
    x = torch.tensor([[1., 0., 2., 0.], [0., 3., 0., 0.], [0., 0., 0., 4.]]).to_sparse()
    return run.topk(x, 2) if top else run(x)


BATCHIFIER_CASES = [
    # a ValueError for what is a wrong kind: a tuple, None, a numpy array, a sparse tensor
    Case("network_returns_tuple", lambda: _batchified(lambda b: (torch.zeros(b, 3),)),
         TypeError, r"network must return a dense tensor of shape \(2, 3\), got tuple"),
    Case("network_returns_none_topk", lambda: _batchified(lambda b: None, top=True), TypeError,
         r"network must return a dense tensor of shape \(2, 3\), got NoneType"),
    Case("network_returns_sparse", lambda: _batchified(lambda b: torch.zeros(b, 3).to_sparse()),
         TypeError, r"network must return a dense tensor of shape \(2, 3\), got shape \(2, 3\), "
                    r"layout torch.sparse_coo"),
    # another shape stays a ValueError
    Case("network_returns_other_width", lambda: _batchified(lambda b: torch.zeros(b, 5)),
         ValueError, r"network must return a dense tensor of shape \(2, 3\), got shape \(2, 5\)"),
    Case("network_returns_scores_works", lambda: _batchified(lambda b: torch.zeros(b, 3)), None,
         check=lambda y: y.shape == (3, 3)),
]


@pytest.mark.parametrize("case", BATCHIFIER_CASES, ids=lambda c: c.id)
def test_probe12_batchifier(case: Case) -> None:
    run_case(case)


# -- choice arguments given another kind than a str: a TypeError, not a ValueError ----------

def _ratings() -> Any:
    from nnsparse.data import synthetic_ratings
    return synthetic_ratings(n_users=5, n_items=5, n_ratings=10, rank=2)


def _file(d: Any, text: str = "1::1::5::0\n") -> Any:
    (d / "f.dat").write_text(text)
    return d / "f.dat"


def _choice_cases() -> List[Case]:
    import numpy as np
    from nnsparse import sparse_linear
    from nnsparse.data import (mean_prediction, rating_matrix, read_item_features,
                               read_user_features)
    from nnsparse.models import AutoRec, fold_files
    from nnsparse.optim import InBackwardOptimizer
    eye = torch.eye(4)
    return [
        # each said ValueError "... must be one of [...], got None" (a wrong kind)
        Case("layer_mode_none", lambda d: SparseLinearBatch(4, 3, mode=None), TypeError,
             r"mode must be one of \['auto', 'sparse', 'dense'\] \(a str\), got NoneType None"),
        Case("sparse_linear_mode_int",
             lambda d: sparse_linear(eye.to_sparse(), torch.zeros(3, 4), mode=1), TypeError,
             r"mode must be one of \['auto', 'sparse', 'dense'\] \(a str\), got int 1"),
        Case("model_orientation_none", lambda d: AutoRec(orientation=None), TypeError,
             r"orientation must be 'item' or 'user' \(a str\), got NoneType None"),
        Case("rating_matrix_orientation_int", lambda d: rating_matrix(_ratings(), orientation=1),
             TypeError, r"orientation must be 'item' or 'user' \(a str\), got int 1"),
        Case("mean_prediction_by_none", lambda d: mean_prediction(_ratings(), _ratings(), by=None),
             TypeError, r"by: orientation must be 'item' or 'user' \(a str\), got NoneType"),
        Case("read_ratings_format_none", lambda d: read_ratings(_file(d), format=None), TypeError,
             r"format must be one of \['auto', 'ml-100k', 'ml-1m', 'csv', 'text'\] \(a str\), got "
             r"NoneType None"),
        Case("read_ratings_unseen_bool", lambda d: read_ratings(_file(d), "ml-1m", unseen=True),
             TypeError, r"unseen must be 'keep' or 'drop' \(a str\), got bool True"),
        Case("read_item_features_format_none",
             lambda d: read_item_features(_file(d, "1::A::Drama\n"), None, {1: 0}), TypeError,
             r"format must be 'ml-100k', 'ml-1m' or 'csv' \(a str\), got NoneType None for item "
             r"features"),
        Case("read_user_features_format_int",
             lambda d: read_user_features(_file(d, "1::M::24::1::0\n"), 1, {1: 0}), TypeError,
             r"format must be 'ml-100k' or 'ml-1m' \(a str\), got int 1 for user features"),
        Case("fold_files_format_none", lambda d: fold_files(d, None), TypeError,
             r"format must be one of \[.*\] \(a str\), got NoneType None"),
        Case("in_backward_optimizer_kind_none",
             lambda d: InBackwardOptimizer(nn.Linear(2, 2), None, {}), TypeError,
             r"kind must be one of \['sgd', .*\] \(a str\), got NoneType None; build it with "
             r"apply_optimizer_in_backward"),
        # an unknown str stays a ValueError; a numpy str is the str it holds
        Case("layer_mode_unknown_str", lambda d: SparseLinearBatch(4, 3, mode="fast"), ValueError,
             r"mode must be one of \['auto', 'sparse', 'dense'\], got 'fast'"),
        Case("read_ratings_format_unknown_str", lambda d: read_ratings(_file(d), format="ML-1M"),
             ValueError, r"format must be one of \[.*\], got 'ML-1M'"),
        Case("model_orientation_numpy_str_works",
             lambda d: AutoRec(orientation=np.str_("user")).hparams["orientation"], None,
             check=lambda o: o == "user" and type(o) is str),
        Case("layer_mode_numpy_str_works", lambda d: SparseLinearBatch(4, 3, mode=np.str_("dense")),
             None, check=lambda layer: layer.mode == "dense" and type(layer.mode) is str),
    ]


@pytest.mark.parametrize("case", _choice_cases(), ids=lambda c: c.id)
def test_probe12_choices(case: Case, tmp_path: Any) -> None:
    run_case(case, tmp_path)


# -- make_optimizer: eps=0 with torch.optim.SparseAdam ---------------------------------------

def _model(sparse_grad: bool = True) -> nn.Module:
    return nn.Sequential(SparseLinearBatch(4, 3, sparse_grad=sparse_grad), nn.Linear(3, 2))


OPTIM_CASES = [
    # torch's "Invalid epsilon value: 0.0", raised by SparseAdam built after the dense part
    Case("make_optimizer_sparse_adam_eps_0",
         lambda: make_optimizer(_model(), sparse="sparse_adam", eps=0.0), ValueError,
         r"eps must be positive with sparse='sparse_adam' \(torch.optim.SparseAdam refuses "
         r"0\), got 0.0; use sparse='lazy_adam' for eps=0"),
    # torch's Adam and LazyAdam take eps=0, as before
    Case("make_optimizer_lazy_adam_eps_0_works",
         lambda: make_optimizer(_model(), eps=0.0), None,
         check=lambda opt: opt.optimizers["sparse"].param_groups[0]["eps"] == 0.0),
    Case("make_optimizer_sparse_adam_eps_0_no_sparse_part_works",
         lambda: make_optimizer(_model(sparse_grad=False), sparse="sparse_adam", eps=0.0), None,
         check=lambda opt: isinstance(opt, torch.optim.Adam)),
    Case("make_optimizer_sparse_adam_positive_eps_works",
         lambda: make_optimizer(_model(), sparse="sparse_adam", eps=1e-8), None,
         check=lambda opt: isinstance(opt.optimizers["sparse"], torch.optim.SparseAdam)),
]


@pytest.mark.parametrize("case", OPTIM_CASES, ids=lambda c: c.id)
def test_probe12_optim(case: Case) -> None:
    run_case(case)


# -- examples/movielens_autoencoder.py: flags refused before any training --------------------

_EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "movielens_autoencoder.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("movielens_autoencoder_probe12", _EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CORES = os.cpu_count() or 1
_THREAD_LIMIT = max(1024, _CORES)  # the examples' bound on --threads
#: six ratings of two users and three items
_SMALL = "".join(f"{u}\t{i}\t{1 + (u + i) % 5}\t0\n" for u in (1, 2) for i in (1, 2, 3))
_FAST = ["--model", "autorec", "--hidden", "2", "--epochs", "1", "--threads", "1",
         "--no-progress"]

# (id, flags, message); "{small}" is a six-rating ml-100k file
CLI_CASES = [
    # beyond int64: the model's ValueError (a traceback, exit status 1) after reading the data
    ("epochs_beyond_int64", ["--epochs", str(2 ** 70)],
     "argument --epochs: --epochs must be below 2**63 (int64), got 1180591620717411303424"),
    ("batch_size_beyond_int64", ["--batch-size", str(2 ** 63)],
     "--batch-size must be below 2**63 (int64), got 9223372036854775808"),
    ("hidden_beyond_int64", ["--hidden", str(2 ** 63)],
     "--hidden must be below 2**63 (int64), got 9223372036854775808"),
    # -k and --min-support reached recommend() only after training
    ("k_beyond_int64", ["--recommend", "1", "-k", str(2 ** 70)],
     "argument -k: -k must be below 2**63 (int64)"),
    ("min_support_beyond_int64", ["--recommend", "1", "--min-support", str(2 ** 63)],
     "--min-support must be below 2**63 (int64), got 9223372036854775808"),
    # torch.manual_seed's "Overflow when unpacking long long"
    ("seed_beyond_uint64", ["--seed", str(2 ** 64)],
     "--seed must be below 2**64 (torch.manual_seed's range), got 18446744073709551616"),
    # torch.set_num_threads(100000000) crashed the process (SIGSEGV); 2**70 overflowed
    ("threads_beyond_cores", ["--threads", str(10 ** 8)],
     f"--threads must be at most {_THREAD_LIMIT}, got 100000000"),
    ("threads_beyond_int64", ["--threads", str(2 ** 70)],
     "--threads must be below 2**63 (int64)"),
    # kfold's ValueError, a traceback
    ("folds_more_than_ratings", ["--ratings", "{small}", "--format", "ml-100k", "--folds", "7"],
     "--folds 7: k-fold needs at least k=7 ratings, got 6"),
    # an empty training part failed in fit; an empty test part in evaluate, after training
    ("test_ratio_leaves_no_training",
     ["--ratings", "{small}", "--format", "ml-100k", "--test-ratio", "0.99"],
     "--test-ratio 0.99 of 6 ratings leaves no training ratings"),
    ("test_ratio_leaves_no_test",
     ["--ratings", "{small}", "--format", "ml-100k", "--test-ratio", "0"],
     "--test-ratio 0.0 of 6 ratings leaves no test ratings"),
    # fit's refusal (before its training), a traceback
    ("validation_ratio_leaves_no_training",
     ["--ratings", "{small}", "--format", "ml-100k", "--validation-ratio", "0.9999"],
     "cannot train on these ratings: train: no ratings are left for training once "
     "validation is held out"),
    ("validation_ratio_leaves_no_training_in_a_fold",
     ["--ratings", "{small}", "--format", "ml-100k", "--folds", "2",
      "--validation-ratio", "0.9999"],
     "cannot train on these folds: train: no ratings are left for training"),
]


@pytest.mark.parametrize("case_id, flags, message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_probe12_cli(case_id: str, flags: List[str], message: str, tmp_path: Any,
                     capsys: Any) -> None:
    (tmp_path / "u.data").write_text(_SMALL)
    argv = _FAST + [f.replace("{small}", str(tmp_path / "u.data")) for f in flags]
    with pytest.raises(SystemExit) as exit:
        _example().main(argv)
    assert exit.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err, captured.err
    assert "Traceback" not in captured.err
    assert "epoch 1" not in captured.out  # nothing was trained


def _parsed(flags: List[str]) -> Dict[str, Any]:
    return vars(_example().parse_args(flags)[1])


@pytest.mark.parametrize("flags, key, value", [
    (["--seed", str(2 ** 64 - 1)], "seed", 2 ** 64 - 1),  # torch.manual_seed takes it
    (["--threads", str(_CORES)], "threads", _CORES),
    # more threads than CPUs: oversubscribed, but torch runs them
    (["--threads", str(_THREAD_LIMIT)], "threads", _THREAD_LIMIT),
    (["--recommend", "1", "-k", str(2 ** 63 - 1)], "k", 2 ** 63 - 1),
    (["--min-support", str(2 ** 63 - 1)], "min_support", 2 ** 63 - 1),
    (["--epochs", str(2 ** 63 - 1)], "epochs", 2 ** 63 - 1),
], ids=["seed_uint64_max", "threads_all_cores", "threads_at_limit", "k_int64_max", "min_support_int64_max",
        "epochs_int64_max"])
def test_probe12_cli_bounds_themselves_are_taken(flags: List[str], key: str, value: Any) -> None:
    assert _parsed(flags)[key] == value


def test_probe12_cli_small_file_still_trains(tmp_path: Any, capsys: Any) -> None:
    """The six-rating file of the rows above trains and is evaluated with valid ratios."""
    (tmp_path / "u.data").write_text(_SMALL)
    result = _example().main(_FAST + ["--ratings", str(tmp_path / "u.data"), "--format",
                                      "ml-100k", "--test-ratio", "0.3",
                                      "--validation-ratio", "0"])
    assert re.search(r"test RMSE: \d", capsys.readouterr().out)
    assert result["test_rmse"] == result["test_rmse"]  # a number, not NaN


# -- examples/ddp_autoencoder.py: the same kinds of flags ------------------------------------

def _ddp_example() -> Any:
    path = _EXAMPLE.parent / "ddp_autoencoder.py"
    spec = importlib.util.spec_from_file_location("ddp_autoencoder_probe12", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DDP_CLI_CASES = [
    # torch.set_num_threads(100000000): the process crashed
    ("threads_beyond_cores", ["--threads", str(10 ** 8)],
     f"--threads must be at most {_THREAD_LIMIT}, got 100000000"),
    # torch.manual_seed's "Overflow when unpacking long long"; synthetic_ratings' ValueError
    ("seed_beyond_uint64", ["--seed", str(2 ** 64)], "--seed must be in [0, 2**64), got"),
    ("seed_negative", ["--seed", "-1"], "--seed must be in [0, 2**64), got -1"),
    ("epochs_beyond_int64", ["--epochs", str(2 ** 63)], "must be below 2**63 (int64)"),
    # NaN passed "value <= 0"; inf was taken
    ("lr_nan", ["--lr", "nan"], "argument --lr: must be positive, got nan"),
    ("lr_inf", ["--lr", "inf"], "argument --lr: must be finite, got inf"),
    # the library's ValueError after the data was made, a traceback
    ("weight_decay_nan", ["--weight-decay", "nan"],
     "--weight-decay must be non-negative and finite, got nan"),
    ("hide_ratio_beyond_one", ["--hide-ratio", "2"],
     "--alpha, --beta, --hide-ratio: hide_ratio must be in [0, 1], got 2.0"),
    ("alpha_negative", ["--alpha", "-1"],
     "--alpha, --beta, --hide-ratio: alpha must be non-negative, got -1.0"),
]


@pytest.mark.parametrize("case_id, flags, message", DDP_CLI_CASES,
                         ids=[c[0] for c in DDP_CLI_CASES])
def test_probe12_ddp_cli(case_id: str, flags: List[str], message: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit:
        _ddp_example().parse_args(flags)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_probe12_ddp_cli_defaults_parse() -> None:
    args = _ddp_example().parse_args(["--seed", str(2 ** 64 - 1), "--threads",
                                      str(_THREAD_LIMIT)])
    assert (args.seed, args.threads) == (2 ** 64 - 1, _THREAD_LIMIT)


# -- the second reading of probe 12: valid inputs its checks refused or changed -------------

class _Choice(str, __import__("enum").Enum):
    """A str enum, the common way to name a choice (its str() is 'Choice.DENSE')."""
    DENSE = "dense"
    USER = "user"


class _Tagged(str):
    """A str subclass with its own str()."""

    def __str__(self) -> str:
        return f"<{str.__str__(self)}>"


class _Sink(__import__("io").RawIOBase):
    """A write-only stream that leaves io.IOBase's writable() (False) as it is: torch.save
    writes to it (it only calls write)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        return len(b)


class _Source(__import__("io").RawIOBase):
    """A seekable stream that leaves io.IOBase's readable() (False) as it is: torch.load
    reads it (it calls read, seek and tell)."""

    def __init__(self, data: bytes) -> None:
        self.inner = __import__("io").BytesIO(data)

    def readinto(self, b: Any) -> int:
        return self.inner.readinto(b)

    def seek(self, *args: Any) -> int:
        return self.inner.seek(*args)

    def tell(self) -> int:
        return self.inner.tell()

    def seekable(self) -> bool:
        return True


def _through_streams() -> Any:
    """A model saved to a ``_Sink`` and loaded from a ``_Source`` of its bytes."""
    from nnsparse.models import RatingModel
    sink = _Sink()
    _fitted().save(sink)
    return RatingModel.load(_Source(bytes(sink.data)))


def _layer_output(mode: Any) -> Any:
    """A layer made with ``mode`` on a sparse batch, beside nn.Linear's dense output."""
    layer = SparseLinearBatch(4, 3, mode=mode)
    x = torch.tensor([[1., 0., 2., 0.], [0., 3., 0., 0.]])
    return layer, layer(x.to_sparse()), nn.functional.linear(x, layer.weight, layer.bias)


SECOND_READING_CASES = [
    # as_choice returned str(value): 'Choice.DENSE', which the layer's forward then refused
    Case("layer_mode_str_enum_works", lambda d: _layer_output(_Choice.DENSE), None,
         check=lambda r: type(r[0].mode) is str and r[0].mode == "dense"
         and torch.allclose(r[1], r[2])),
    Case("model_orientation_str_enum_works",
         lambda d: __import__("nnsparse.models", fromlist=["AutoRec"]).AutoRec(
             orientation=_Choice.USER).hparams["orientation"], None,
         check=lambda o: type(o) is str and o == "user"),
    Case("layer_mode_str_subclass_with_own_str_works",
         lambda d: SparseLinearBatch(4, 3, mode=_Tagged("dense")).mode, None,
         check=lambda m: type(m) is str and m == "dense"),
    # check_file_object took io.IOBase's default writable() / readable() (False) for a
    # stream's mode: streams torch.save / torch.load use were refused
    Case("save_and_load_iobase_streams_work", lambda d: _through_streams(), None,
         check=lambda m: torch.equal(m.decoder.weight, _fitted().decoder.weight)),
    Case("distributed_save_to_iobase_stream_works",
         lambda d: (lambda s: (__import__("nnsparse.distributed", fromlist=["save"]).save(
             {"a": torch.ones(2)}, s), s)[1])(_Sink()), None,
         check=lambda s: torch.equal(torch.load(__import__("io").BytesIO(bytes(s.data)),
                                                weights_only=True)["a"], torch.ones(2))),
    # a gzip file's mode is an int: the message said "(mode 2)"
    Case("load_from_gzip_file_open_for_writing",
         lambda d: __import__("nnsparse.models", fromlist=["RatingModel"]).RatingModel.load(
             __import__("gzip").GzipFile(fileobj=__import__("io").BytesIO(), mode="wb")),
         ValueError, r"path must be a file object open to read \(open\(..., 'rb'\)\), got one "
                     r"that is not$"),
]


@pytest.mark.parametrize("case", SECOND_READING_CASES, ids=lambda c: c.id)
def test_probe12_second_reading(case: Case, tmp_path: Any) -> None:
    run_case(case, tmp_path)


@pytest.mark.parametrize("flags, shows", [
    (["--save", "{dir}/m.pt"], "trained"),
    (["--recommend", "1", "-k", "2", "--min-support", "0"], "items for user 1:"),
], ids=["save", "recommend"])
def test_probe12_cli_test_ratio_0_trains_on_all(flags: List[str], shows: str, tmp_path: Any,
                                                capsys: Any) -> None:
    """``--test-ratio 0`` (in its [0, 1) range) with something to do but evaluating: a model
    trained on all the ratings, saved or asked for recommendations (the probe refused it;
    before the probe the model was saved, then the evaluation of no ratings failed)."""
    (tmp_path / "u.data").write_text(_SMALL)
    argv = _FAST + ["--ratings", str(tmp_path / "u.data"), "--format", "ml-100k",
                    "--test-ratio", "0", "--validation-ratio", "0"]
    result = _example().main(argv + [f.replace("{dir}", str(tmp_path)) for f in flags])
    out = capsys.readouterr().out
    assert shows in out.lower() and "no test ratings (--test-ratio 0): not evaluated" in out
    assert result["test_rmse"] is None and result["epochs"]
    if "--save" in flags:
        from nnsparse.models import RatingModel
        assert RatingModel.load(tmp_path / "m.pt").predict_entries(torch.tensor([0]), torch.tensor([0])).shape == (1,)
