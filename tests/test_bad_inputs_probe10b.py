"""The tenth bad-input probe, part b (docs/bad_inputs_probe10b.md): the model zoo's use
after fit (fallback, predict_entries, recommend, evaluate, save of a moved model), the
Trainer's devices, flags and epochs, nnsparse.distributed without a process group,
cross_validate's folds and fold_files, and sizes beyond int64 elements in
DynamicSparseTensor.build and from_pairs.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).  The cross_validate rows count the models made:
a refused fold is refused before any model is fitted.
"""
import copy
import io
from typing import Any, Callable, List

import numpy as np
import pytest
import torch

from probe_cases import Case, run_case
import nnsparse.distributed as nd
from nnsparse import DynamicSparseTensor, from_pairs, ssort, ssort_by_index
from nnsparse.data import Ratings, synthetic_ratings, split_ratings
from nnsparse.models import AutoRec, CFN, KernelNet, Trainer, cross_validate, fold_files, \
    kfold

TINY = dict(hidden=8, epochs=1, batch_size=8, lr=1e-2, validation_ratio=0.0)



@pytest.fixture(scope="module")
def fitted():
    """``(model, train, test)``: a tiny AutoRec fitted on 30 users x 20 items (one epoch)."""
    ratings = synthetic_ratings(seed=3, n_users=30, n_items=20, n_ratings=300)
    train, test = split_ratings(ratings, 0.2, seed=0)
    torch.manual_seed(0)
    return AutoRec(**TINY).fit(train, verbose=False, progress=False), train, test


def _on_meta(model: AutoRec) -> AutoRec:
    return copy.deepcopy(model).to("meta")


def _long(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


_META = r"AutoRec's parameters must hold data, got them on the meta device"

MODEL_CASES = [
    # fallback read index -1 as the last user / item and counted the entry as known
    Case("fallback-negative-user", lambda f: f[0].fallback(_long(-1, 0), _long(0, 0)),
         ValueError, r"users must be non-negative, got min -1"),
    Case("fallback-negative-item", lambda f: f[0].fallback(_long(0), _long(-2)),
         ValueError, r"items must be non-negative, got min -2"),
    Case("fallback-valid", lambda f: f[0].fallback(_long(0, 10 ** 6), _long(10 ** 6, 10 ** 6)),
         None, check=lambda out: out[1] == dict(item_mean=0, user_mean=1, global_mean=1)),
    Case("predict-entries-negative", lambda f: f[0].predict_entries(_long(0), _long(-1)),
         ValueError, r"items must be non-negative, got min -1"),
    Case("predict-entries-duplicates-agree", lambda f: f[0].predict_entries(
        _long(0, 0, 0), _long(1, 1, 1)), None, check=lambda p: bool((p == p[0]).all())),
    # by_index took tensor([0]) (operator.index reads a one-element tensor); the id path
    # refuses a 1-D tensor, and so does by_index now
    Case("recommend-by-index-1d-tensor", lambda f: f[0].recommend(
        _long(0), by_index=True, min_support=0), TypeError,
         r"user must be an int index with by_index=True, got Tensor"),
    Case("recommend-by-index-1d-array", lambda f: f[0].recommend(
        np.array([0]), by_index=True, min_support=0), TypeError,
         r"user must be an int index with by_index=True, got ndarray"),
    Case("recommend-by-index-0d-tensor", lambda f: f[0].recommend(
        torch.tensor(0), by_index=True, min_support=0, k=3), None,
         check=lambda rec: len(rec.ids) == 3),
    Case("recommend-by-index-numpy-int", lambda f: f[0].recommend(
        np.int64(0), by_index=True, min_support=0, k=3), None,
         check=lambda rec: len(rec.ids) == 3),
    Case("recommend-k-0", lambda f: f[0].recommend(0, k=0, min_support=0), None,
         check=lambda rec: rec.ids == [] and rec.index.shape == (0,)),
    Case("recommend-k-huge-gives-every-candidate", lambda f: f[0].recommend(
        0, k=10 ** 12, min_support=0, exclude_rated=False), None,
         check=lambda rec: len(rec.ids) == 20),
    # a model moved to the meta device after fit said "row_index must hold data" (an
    # argument the caller never passed), and save "Cannot copy out of meta tensor"
    Case("meta-model-predict-entries", lambda f: _on_meta(f[0]).predict_entries(
        _long(0), _long(0)), ValueError, _META),
    Case("meta-model-recommend", lambda f: _on_meta(f[0]).recommend(0, min_support=0),
         ValueError, _META),
    Case("meta-model-evaluate", lambda f: _on_meta(f[0]).evaluate(f[2]), ValueError, _META),
    Case("meta-model-predict", lambda f: _on_meta(f[0]).predict(f[2]), ValueError, _META),
    # a model moved to another dtype after fit predicts as before (float32 out)
    Case("double-model-predicts-the-same", lambda f: (
        copy.deepcopy(f[0]).double().predict(f[2]), f[0].predict(f[2])), None,
         check=lambda pair: pair[0].dtype == torch.float32
         and torch.allclose(pair[0], pair[1], atol=1e-5)),
]


def _meta_save(fitted: Any, tmp_path: Any) -> Any:
    path = tmp_path / "meta.pt"
    try:
        _on_meta(fitted[0]).save(path)
    finally:
        assert not path.exists(), "a refused save wrote a file"


def _trainer(f: Any, **kw: Any) -> Trainer:
    return Trainer(f[0], epochs=1, batch_size=4, lr=0.1, log=None, **kw)


TRAINER_CASES = [
    # Trainer refused numpy bools with "progress must be None or a bool, got bool"
    # (fit, which builds the Trainer, took them)
    Case("trainer-progress-numpy-bool", lambda f: _trainer(f, progress=np.bool_(False)),
         None, check=lambda t: t.progress is False),
    Case("trainer-progress-str", lambda f: _trainer(f, progress="no"), TypeError,
         r"progress must be None or a bool, got str 'no'"),
    Case("trainer-progress-int", lambda f: _trainer(f, progress=0), TypeError,
         r"progress must be None or a bool, got int 0"),
    # Trainer(device="meta") was taken, and fit failed with "row_index must hold data"
    Case("trainer-device-meta", lambda f: _trainer(f, device="meta"), ValueError,
         r"device must hold data, got 'meta'; use 'cpu' or 'cuda'"),
    # fit(epochs=) beyond the Trainer's epochs ran on past the cosine schedule, whose
    # learning rate then rose again (back to the full lr at epoch 2 * epochs - 1)
    Case("trainer-fit-epochs-beyond-schedule", lambda f: _trainer(f, progress=False).fit(
        f[0]._input, epochs=3), ValueError,
         r"epochs must be at most the schedule's length \(this Trainer's epochs=1\), got 3: "
         r"the cosine learning rate would rise again past it; make a Trainer with epochs=3"),
    Case("trainer-fit-epochs-within-schedule", lambda f: Trainer(
        copy.deepcopy(f[0]), epochs=3, batch_size=8, lr=1e-3, log=None, progress=False).fit(
        f[0]._input, epochs=2), None, check=lambda result: len(result.history) == 2),
    # an int device said "must be a torch.device or a name", an index being one too: the
    # message now gives torch's reason (a negative index; no accelerator for index 0)
    Case("trainer-device-negative-index", lambda f: _trainer(f, device=-1), ValueError,
         r"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got -1 "
         r"\(Device index must not be negative\)"),
    Case("fit-device-negative-index", lambda f: AutoRec(**TINY).fit(
        f[1], device=-1, verbose=False, progress=False), ValueError,
         r"got -1 \(Device index must not be negative\)"),
    Case("trainer-device-meta-torch", lambda f: _trainer(f, device=torch.device("meta")),
         ValueError, r"device must hold data, got 'meta'"),
]

DISTRIBUTED_CASES = [
    # progress(disable=np.True_) said "disable must be None or a bool, got bool np.True_";
    # loader's flags took numpy bools already
    Case("progress-disable-numpy-bool", lambda f: nd.progress([1, 2], disable=np.bool_(True)),
         None, check=lambda it: list(it) == [1, 2]),
    # a keyword tqdm does not take failed on rank 0 with a bar only (TqdmKeyError, a
    # KeyError), and was ignored without a bar or on the other ranks
    Case("progress-unknown-keyword-without-bar", lambda f: nd.progress(
        [1], disable=True, nope=1), TypeError,
         r"kwargs must be tqdm's arguments, got unknown \['nope'\]"),
    Case("progress-unknown-keyword-with-bar", lambda f: nd.progress(
        [1], disable=False, desk="typo"), TypeError,
         r"kwargs must be tqdm's arguments, got unknown \['desk'\]"),
    Case("progress-tqdm-keywords", lambda f: nd.progress(
        [1, 2], disable=False, desc="d", leave=False, file=io.StringIO()), None,
         check=lambda bar: list(bar) == [1, 2]),
    Case("progress-disable-str", lambda f: nd.progress([1], disable="yes"), TypeError,
         r"disable must be None or a bool, got str 'yes'"),
    Case("wrap-sparse-allgather-numpy-bool", lambda f: nd.wrap(
        torch.nn.Linear(2, 2), sparse_allgather=np.bool_(False)), None,
         check=lambda m: isinstance(m, torch.nn.Linear)),
    Case("wrap-sparse-allgather-int", lambda f: nd.wrap(torch.nn.Linear(2, 2),
                                                          sparse_allgather=1),
         TypeError, r"sparse_allgather must be None or a bool, got int 1"),
    Case("loader-shuffle-numpy-bool", lambda f: nd.loader(list(range(6)), 2,
                                                          shuffle=np.bool_(False)),
         None, check=lambda loader: [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]),
    # torch's "Default process group has not been initialized, please make sure to call
    # init_process_group" named neither nnsparse's init_from_env nor wrap
    Case("ddp-without-process-group", lambda f: nd.DistributedDataParallel(
        torch.nn.Linear(2, 2)), RuntimeError,
         r"DistributedDataParallel needs a process group; call "
         r"nnsparse.distributed.init_from_env\(\) under torchrun, or use "
         r"nnsparse.distributed.wrap\(model\)"),
    Case("ddp-unknown-argument", lambda f: nd.DistributedDataParallel(
        torch.nn.Linear(2, 2), bucket_size=3), TypeError, r"unexpected keyword argument"),
    Case("helpers-without-process-group", lambda f: (
        nd.is_distributed(), nd.rank(), nd.world_size(), nd.is_main()), None,
         check=lambda out: out == (False, 0, 1, True)),
]


# -- cross_validate's folds ---------------------------------------------------------------

def _ratings() -> Ratings:
    """20 users x 15 items, 8 distinct items each."""
    gen = np.random.default_rng(0)
    users, items, values = [], [], []
    for u in range(20):
        for i in gen.choice(15, 8, replace=False):
            users.append(100 + u)
            items.append(200 + int(i))
            values.append(float(gen.integers(1, 6)))
    return Ratings.from_triples(users, items, values)


def _cv(folds: Callable[[Ratings], List[Any]]) -> Callable[[Any], Any]:
    """cross_validate over ``folds(ratings)``, checking that a refused call made no model."""
    def call(f: Any) -> Any:
        made: List[AutoRec] = []

        def make() -> AutoRec:
            made.append(AutoRec(**TINY))
            return made[-1]
        try:
            return cross_validate(make, folds(_ratings()), progress=False)
        except Exception:
            assert not made, "a refused fold was checked after a model was made"
            raise
    return call


def _split(r: Ratings) -> Any:
    return split_ratings(r, 0.25, seed=0)


def _other_maps(r: Ratings) -> List[Any]:
    """The test part indexed by a record of its own (fewer users: other indices)."""
    train, test = _split(r)
    keep = test.user != test.user.min()
    mine = Ratings.from_triples([test.user_ids()[u] for u in test.user[keep].tolist()],
                                [test.item_ids()[i] for i in test.item[keep].tolist()],
                                test.rating[keep].tolist())
    return [(train, mine)]


CV_CASES = [
    # a fold testing on its training ratings was scored (an optimistic RMSE, no word)
    Case("cv-fold-test-is-train", _cv(lambda r: [(_split(r)[0], _split(r)[0])]), ValueError,
         r"fold 1's train and test together: \d+ \(user, item\) pairs rated more than once"),
    Case("cv-fold-test-overlaps", _cv(lambda r: [
        (_split(r)[0], r.subset(torch.arange(len(r)) < 10))]), ValueError,
         r"fold 1's train and test together: \d+ \(user, item\) pairs? rated more than once"),
    # an empty test part was refused after the fit, as "ratings holds no ratings"
    Case("cv-fold-test-empty", _cv(lambda r: [
        (_split(r)[0], r.subset(torch.zeros(len(r), dtype=torch.bool)))]), ValueError,
         r"fold 1's test holds no ratings; there is nothing to score"),
    # a test part with other id maps was refused after the fit, naming "ratings"
    Case("cv-fold-test-other-maps", _cv(_other_maps), ValueError,
         r"fold 1's test must index users as in fold 1's train"),
    Case("cv-fold-test-repeats-a-pair", _cv(lambda r: [
        (_split(r)[0], _split(r)[1].subset(torch.zeros(2, dtype=torch.int64)))]), ValueError,
         r"fold 1's test: 1 \(user, item\) pair rated more than once"),
    Case("cv-kfold-works", _cv(lambda r: list(kfold(r, k=2))), None,
         check=lambda cv: len(cv.folds) == 2 and all(f["fallback"] >= 0 for f in cv.folds)),
    Case("cv-split-works", _cv(lambda r: [_split(r)]), None,
         check=lambda cv: len(cv.folds) == 1 and cv.folds[0]["rmse"] > 0),
]


def _fold_dir(tmp_path: Any, base_is_dir: bool) -> Any:
    """u1.base/u1.test and u2.base/u2.test (ml-100k lines), u2.base a folder when asked."""
    lines = [f"{u}\t{i}\t{1 + (u * i) % 5}\t0\n" for u in range(1, 9) for i in range(1, 6)]
    (tmp_path / "u1.base").write_text("".join(lines[:30]))
    (tmp_path / "u1.test").write_text("".join(lines[30:]))
    (tmp_path / "u2.test").write_text("".join(lines[:10]))
    if base_is_dir:
        (tmp_path / "u2.base").mkdir()
    else:
        (tmp_path / "u2.base").write_text("".join(lines[10:]))
    return tmp_path


def test_probe10b_fold_files_base_directory(tmp_path: Any) -> None:
    """A u<N>.base folder was paired and failed at its fold, after the earlier folds' fits."""
    with pytest.raises(ValueError, match=r"folds: .*u2.base must be a rating file, got a "
                                         r"directory"):
        fold_files(_fold_dir(tmp_path, True))


def test_probe10b_fold_files_pairs(tmp_path: Any) -> None:
    sizes = [(len(a), len(b)) for a, b in fold_files(_fold_dir(tmp_path, False))]
    assert sizes == [(30, 10), (30, 10)]


def _builder(*index: int) -> DynamicSparseTensor:
    builder = DynamicSparseTensor(ndim=2)
    builder.append(index, 1.0)
    return builder


def _pairs() -> torch.Tensor:
    return torch.tensor([[3., 1.], [1., 5.], [2., 2.], [4., 0.]])


def _sort_views(sort: Callable[..., Any], views: Callable[[torch.Tensor], List[Any]]) -> Any:
    """``sort(views(p), inplace=True)``; a refused call must leave ``p`` as it was."""
    p = _pairs()
    try:
        return sort(views(p), inplace=True), p
    except RuntimeError:
        assert torch.equal(p, _pairs()), "a refused in-place sort changed the tensor"
        raise


BUILDER_CASES = [
    # overlapping views in one list were each written with their own sorted entries: the
    # shared row took the other view's entry and the entry [1, 5] was lost from p
    Case("ssort-inplace-overlapping-views", lambda: _sort_views(
        ssort, lambda p: [p[:3], p[1:]]), RuntimeError,
         r"inplace=True cannot reorder x: x\[0\] and x\[1\] share elements \(overlapping "
         r"views of one tensor\)"),
    Case("ssort-by-index-inplace-overlapping-views", lambda: _sort_views(
        ssort_by_index, lambda p: [p[:2], torch.ones(1, 2), p[1:3]]), RuntimeError,
         r"x\[0\] and x\[2\] share elements"),
    Case("ssort-inplace-disjoint-views", lambda: _sort_views(
        ssort, lambda p: [p[::2], p[1::2]]), None,
         check=lambda out: out[1].tolist() == [[3., 1.], [4., 0.], [2., 2.], [1., 5.]]),
    Case("ssort-inplace-same-view-twice", lambda: _sort_views(
        ssort, lambda p: [p, p]), None,
         check=lambda out: out[1].tolist() == [[4., 0.], [3., 1.], [2., 2.], [1., 5.]]),

    # torch's sparse constructor said "numel: integer multiplication overflow"
    Case("builder-size-beyond-int64-elements", lambda: _builder(0, 1).build(
        size=(2 ** 62, 2 ** 62)), ValueError,
         r"size must have at most 2\*\*63 - 1 elements \(torch counts them in int64\), got "
         r"\(4611686018427387904, 4611686018427387904\)$"),
    Case("builder-indices-beyond-int64-elements", lambda: _builder(2 ** 62, 2 ** 62).build(),
         ValueError, r"size must have at most 2\*\*63 - 1 elements .*got "
                     r"\(4611686018427387905, 4611686018427387905\) \(the largest indices \+ 1: "
                     r"no size was given\)"),
    Case("builder-indices-beyond-int64-elements-csr", lambda: _builder(2 ** 62, 2 ** 62).build(
        layout=torch.sparse_csr), ValueError, r"size must have at most 2\*\*63 - 1 elements"),
    Case("from-pairs-batch-beyond-int64-elements", lambda: from_pairs(
        [torch.tensor([[1., 2.]], dtype=torch.float64)] * 4, size=2 ** 62), ValueError,
         r"pairs must have at most 2\*\*63 - 1 elements \(torch counts them in int64\), got a "
         r"batch of size \(4, 4611686018427387904\)$"),
    Case("from-pairs-batch-beyond-int64-elements-by-index", lambda: from_pairs(
        [torch.tensor([[2 ** 62, 1]])] * 4), ValueError,
         r"pairs must have at most 2\*\*63 - 1 elements .*got a batch of size "
         r"\(4, 4611686018427387905\) \(its width is the largest index \+ 1\)$"),
    Case("from-pairs-large-batch-within-int64", lambda: from_pairs(
        [torch.tensor([[1., 2.]], dtype=torch.float64)] * 4, size=2 ** 60), None,
         check=lambda t: t.shape == (4, 2 ** 60) and t._nnz() == 4),
    Case("builder-large-size-within-int64", lambda: _builder(0, 1).build(size=(2 ** 31, 2 ** 31)),
         None, check=lambda t: t.shape == (2 ** 31, 2 ** 31) and t._nnz() == 1),
]


@pytest.mark.parametrize("case", BUILDER_CASES, ids=lambda c: c.id)
def test_probe10b_builder(case: Case) -> None:
    run_case(case)



@pytest.mark.parametrize("case", MODEL_CASES + TRAINER_CASES + DISTRIBUTED_CASES + CV_CASES,
                         ids=lambda c: c.id)
def test_probe10b(case: Case, fitted: Any) -> None:
    run_case(case, fitted)


def test_probe10b_meta_model_save(fitted: Any, tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=_META):
        _meta_save(fitted, tmp_path)


@pytest.mark.skipif(torch.accelerator.is_available(),
                    reason="device index 0 is this machine's accelerator")
def test_probe10b_device_index_without_accelerator(fitted: Any) -> None:
    with pytest.raises(ValueError, match=r"got 0 \(Cannot access accelerator device"):
        _trainer(fitted, device=0)


@pytest.mark.parametrize("cls", [CFN, KernelNet], ids=lambda c: c.__name__)
def test_probe10b_other_models_fallback_and_meta(cls: type, fitted: Any) -> None:
    """The checks live in RatingModel: CFN and KernelNet refuse as AutoRec does."""
    train = fitted[1]
    torch.manual_seed(0)
    model = cls(**TINY).fit(train, verbose=False, progress=False)
    with pytest.raises(ValueError, match=r"users must be non-negative, got min -1"):
        model.fallback(_long(-1), _long(0))
    with pytest.raises(ValueError, match=rf"{cls.__name__}'s parameters must hold data"):
        copy.deepcopy(model).to("meta").recommend(0, min_support=0)
