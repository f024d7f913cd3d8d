"""Whole nnsparse modules, and nnsparse's results and records, through torch.save /
torch.load(weights_only=True)."""
import fractions
import io
from typing import NamedTuple

import pytest
import torch
from torch import nn

import nnsparse

_g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
# Every nn.Module nnsparse exports, with the arguments that change what it pickles.
CASES = {
    "SparseLinearBatch": lambda: nnsparse.SparseLinearBatch(6, 3),
    "SparseLinearBatch-sparse_grad": lambda: nnsparse.SparseLinearBatch(6, 3, sparse_grad=True),
    "SparseOutputLinear": lambda: nnsparse.SparseOutputLinear(3, 6, sparse_grad=True),
    "Densify": lambda: nnsparse.Densify(6, elem=-1.0),
    "Sparsify": lambda: nnsparse.Sparsify(offset=2, layout=torch.sparse_csr),
    "Normalize": lambda: nnsparse.Normalize(p=1, eps=0.5),
    "PatternSequential": lambda: nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 3), nnsparse.SparseOutputLinear(3, 6)),
    "SparseWeightLinear": lambda: nnsparse.SparseWeightLinear.random(6, 3, 0.5, seed=1),
    "SparseCriterion": lambda: nnsparse.SparseCriterion(nn.L1Loss(), size_average=False),
    "SDAECriterion": lambda: nnsparse.SDAECriterion(nn.MSELoss(), alpha=2.0, generator=_g()),
    "SDAESparseCriterion": lambda: nnsparse.SDAESparseCriterion(
        nn.BCEWithLogitsLoss(), hide_ratio=0.25, generator=_g()),
    "MaskCriterion": lambda: nnsparse.MaskCriterion(nn.HuberLoss(), alpha=0.5),
}
# ValuesMap holds a user's function: the user allows it (see test_values_map).
NOT_HERE = {"ValuesMap"}


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True, **load_kwargs)


def test_every_exported_module_is_covered():
    exported = {name for name in nnsparse.__all__
                if isinstance(getattr(nnsparse, name), type)
                and issubclass(getattr(nnsparse, name), nn.Module)}
    covered = {name.split("-")[0] for name in CASES} | NOT_HERE
    assert exported <= covered, f"add a case for {sorted(exported - covered)}"


@pytest.mark.parametrize("name", list(CASES))
def test_whole_module_loads_with_weights_only(name):
    torch.manual_seed(0)
    module = CASES[name]()
    loaded = _round_trip(module)
    assert type(loaded) is type(module)
    assert repr(loaded) == repr(module)
    for (k, a), (k2, b) in zip(module.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert vars(loaded).keys() == vars(module).keys()


def test_loaded_layers_compute_the_same():
    torch.manual_seed(0)
    model = CASES["PatternSequential"]()
    loaded = _round_trip(model)
    x = torch.tensor([[1., 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 1]]).to_sparse()
    torch.testing.assert_close(loaded(x, x).to_dense(), model(x, x).to_dense())
    sg = _round_trip(CASES["SparseLinearBatch-sparse_grad"]())
    sg(x).sum().backward()  # the sparse-gradient layout and state_dict hooks survive
    assert sg.weight_t.grad.is_sparse and "weight" in sg.state_dict()


def test_loaded_criterion_keeps_its_generator_stream():
    crit = CASES["SDAESparseCriterion"]()
    loaded = _round_trip(crit)
    x = torch.tensor([[1., 0, 0, 2, 0, 4], [0, 0, 3, 0, 5, 1]]).to_sparse()
    a, b = crit.prepare_input(x), loaded.prepare_input(x)
    torch.testing.assert_close(a.to_dense(), b.to_dense())


def test_values_map():
    # A torch function pickles through builtins.getattr, which nnsparse does not allow;
    # a module as the function loads once the user allows its class.
    with pytest.raises(Exception, match="getattr"):
        _round_trip(nnsparse.ValuesMap(torch.tanh))
    with torch.serialization.safe_globals([nn.Tanh]):
        loaded = _round_trip(nnsparse.ValuesMap(nn.Tanh()))
    x = torch.tensor([0.5, 0, -1]).to_sparse()
    torch.testing.assert_close(loaded(x).to_dense(), torch.tanh(x.to_dense()))


def test_user_model_needs_its_own_classes_and_state_dict_needs_none():
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 3), nn.Tanh(),
                          nnsparse.SparseOutputLinear(3, 6))
    with pytest.raises(Exception, match="Sequential"):
        _round_trip(model)
    with torch.serialization.safe_globals([nn.Sequential, nn.Tanh]):
        assert isinstance(_round_trip(model), nn.Sequential)
    state = _round_trip(model.state_dict())
    fresh = nn.Sequential(nnsparse.SparseLinearBatch(6, 3), nn.Tanh(),
                          nnsparse.SparseOutputLinear(3, 6))
    fresh.load_state_dict(state)
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(a, b)


# -- nnsparse's results and records: allow-listed at import -----------------------------------

def _ratings():
    from nnsparse.data import synthetic_ratings
    return synthetic_ratings(0, 20, 15, 120)


def _errors():
    from nnsparse.data import RatingErrors
    errors = RatingErrors()
    errors.update(torch.tensor([3., 4.]), torch.tensor([4., 4.]))
    return errors


def _dataset():
    from nnsparse.data import SparseRowDataset
    return SparseRowDataset(torch.tensor([[1., 0, 2], [0, 3, 0]]).to_sparse_csr())


_v = torch.tensor([3., 0, 1, 2]).to_sparse()
# Every nnsparse class of a result or record that torch.load's default reads.
DATA_CASES = {
    "SortResult": lambda: nnsparse.ssort(_v),
    "SortResult-descending": lambda: nnsparse.ssort(_v, descending=True),
    "TopkResult": lambda: nnsparse.stopk(_v, 2),
    "Recommendations": lambda: nnsparse.models.Recommendations(
        [10, "b"], torch.tensor([3, 1]), torch.tensor([4.5, 4.]), torch.tensor([4.6, 4.1]),
        torch.tensor([20, 31]), ["x", "y"]),
    "CrossValidation": lambda: nnsparse.models.CrossValidation(
        [dict(fold=1, rmse=0.9, mae=0.7, fallback=0, epochs=3, seconds=1.5)]),
    "CrossValidation-ranked": lambda: nnsparse.models.CrossValidation(
        [dict(fold=1, rmse=0.9, mae=0.7, fallback=0, epochs=3, seconds=1.5,
              **{"ndcg@10": 0.1, "ranked_users": 9, "rank_seconds": 0.2})], k=10, threshold=4.0),
    "TrainResult": lambda: nnsparse.models.TrainResult(
        [{"epoch": 1, "train_loss": 0.5, "valid_rmse": 0.9}], 1, 0.9),
    "Ratings": _ratings,
    "Split": lambda: nnsparse.data.random_split(_ratings(), test=0.1, validation=0.1),
    "UserSplit": lambda: nnsparse.data.user_split(_ratings(), test=1, validation=1),
    "HeldOut": lambda: nnsparse.data.user_split(_ratings(), test=1, validation=1).test,
    "RatingErrors": _errors,
    "SparseRow": lambda: _dataset()[1][1],
}


def _same(a, b):
    """``a`` and ``b`` equal field by field: tensors by value, dtype and layout."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.layout == b.layout and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.to_dense(), b.to_dense())
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif hasattr(a, "__slots__"):
        for k in a.__slots__:
            _same(getattr(a, k), getattr(b, k))
    elif isinstance(a, nnsparse.data.Ratings):  # its "pairs checked" mark is not loaded
        _same({**vars(a), "_unique": None}, {**vars(b), "_unique": None})
    elif hasattr(a, "__dict__"):
        _same(vars(a), vars(b))
    else:
        assert a == b or (a != a and b != b)  # nan == nan here


@pytest.mark.parametrize("name", list(DATA_CASES))
def test_result_loads_with_the_default_weights_only(name):
    obj = DATA_CASES[name]()
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    loaded = torch.load(buf)  # torch's default: weights_only=True
    _same(loaded, obj)


def test_every_allow_listed_result_is_covered():
    from nnsparse._serialization import _data_classes
    covered = {type(make()) for make in DATA_CASES.values()}
    assert set(_data_classes()) <= covered


def test_loaded_results_work():
    split = _round_trip(DATA_CASES["Split"]())
    assert split.train.user_map is split.test.user_map  # pickle keeps the shared id maps
    assert _round_trip(_errors()).compute() == _errors().compute()
    values, indices = _round_trip(nnsparse.ssort(_v))  # unpacks as the named tuple
    assert torch.equal(indices, nnsparse.ssort(_v).indices)
    ds = _dataset()
    # a row rebuilt from a file is not the dataset's own: the collate checks it in full
    row = _round_trip(type(ds[0][1])(torch.tensor([0, 5]), torch.ones(2)))
    with pytest.raises(ValueError, match=r"indices must be in \[0, 3\), got max 5"):
        ds.collate([(0, row)])


# A file that holds a matrix and rows beside it: a row's index tensor can be a view of the
# matrix's index storage, at the pointer of the dataset's own row but with another stride
# (reading past the index tensor into unchecked memory of the same storage) or holding
# values of another shape or dtype.  collate must check such a row in full, as a foreign one.
_BIG = [1, 3, 2, 10 ** 6]  # the matrix's column indices are the first three
ALIASED_ROWS = {
    "stride-past-the-indices": (lambda big: big.as_strided((2,), (3,), 0), lambda: torch.ones(2),
                                ValueError, r"rows indices must be in \[0, 4\), got max 1000000"),
    "stride-0": (lambda big: big.as_strided((2,), (0,), 0), lambda: torch.ones(2), ValueError,
                 r"rows\[0\] indices must be increasing and unique within the row, got \[1, 1\]"),
    "values-2-D": (lambda big: big[:2], lambda: torch.ones(2, 3), ValueError,
                   r"rows\[0\] must have one value per index \(1-D, equal lengths\), got "
                   r"indices of shape \(2,\) and values of shape \(2, 3\)"),
    "values-float64": (lambda big: big[:2], lambda: torch.ones(2, dtype=torch.float64), TypeError,
                       r"items\[0\] holds values of dtype torch.float64 on cpu, this "
                       r"dataset's are torch.float32"),
}


@pytest.mark.parametrize("name", list(ALIASED_ROWS))
def test_loaded_row_aliasing_the_matrix_is_checked(name):
    from nnsparse.data import SparseRowDataset
    from nnsparse.data.dataset import SparseRow
    indices, values, error, match = ALIASED_ROWS[name]
    big = torch.tensor(_BIG)
    matrix = torch.sparse_csr_tensor(torch.tensor([0, 2, 3]), big[:3], torch.tensor([1., 2., 3.]),
                                     (2, 4))
    buf = io.BytesIO()
    torch.save({"matrix": matrix, "items": [(0, SparseRow(indices(big), values()))]}, buf)
    buf.seek(0)
    data = torch.load(buf)  # torch's default: weights_only=True
    ds = SparseRowDataset(data["matrix"])
    assert ds._input[1].data_ptr() == data["items"][0][1].indices.data_ptr()  # the own row's
    with pytest.raises(error, match=match):
        ds.collate(data["items"])  # (a trusted batch of column 10**6 crashed a CSR matmul)
    assert torch.equal(ds.collate([ds[0]]).input.to_dense(), torch.tensor([[0., 1., 0., 2.]]))


def _edited_ratings(edit):
    ratings = nnsparse.data.Ratings.from_triples([10, 10, 42], [7, 9, 7], [4., 3., 5.])
    ratings._mark_unique()
    edit(ratings)
    return ratings


# A Ratings record (alone or in a Split) whose fields were never checked: torch's unpickler
# sets them without the constructor.  Loading checks them again, as the constructor does.
BAD_RATINGS = {
    "negative-user": (lambda r: r.user.__setitem__(0, -10 ** 12), ValueError,
                      r"Ratings.user indices must be in \[0, 2\) \(the size of user_map\), "
                      r"got min -1000000000000, max 1"),
    "item-beyond-map": (lambda r: r.item.__setitem__(1, 7), ValueError,
                        r"Ratings.item indices must be in \[0, 2\) \(the size of item_map\), "
                        r"got min 0, max 7"),
    "forged-inverse-map": (lambda r: (r.user_ids(), r.user_map.__setitem__(10, 1)), ValueError,
                           r"user_map"),
    # (past the assignment's check, as a file sets it)
    "int-rating": (lambda r: object.__setattr__(r, "rating", torch.tensor([4, 3, 5])), TypeError,
                   r"Ratings.rating must be a floating-point tensor, got torch.int64"),
}


@pytest.mark.parametrize("name", list(BAD_RATINGS))
@pytest.mark.parametrize("in_split", [False, True], ids=["Ratings", "Split"])
def test_loaded_ratings_are_checked(name, in_split):
    edit, error, match = BAD_RATINGS[name]
    bad = _edited_ratings(edit)
    good = _edited_ratings(lambda r: None)
    # (a Split refuses a part on other maps, as forged-inverse-map's: all three are bad there)
    parts = (bad, bad, bad) if name == "forged-inverse-map" else (good, good, bad)
    obj = nnsparse.data.Split(*parts) if in_split else bad
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    with pytest.raises(error, match=match):
        torch.load(buf)  # (a negative user index of an item matrix crashed a CSR matmul)


def test_loaded_ratings_drop_their_caches():
    ratings = _round_trip(_edited_ratings(lambda r: r.user_ids()))
    assert ratings._unique is None
    assert {key: ids for key, (_, ids) in ratings._ids.items()} == {"user": [10, 42],
                                                                     "item": [7, 9]}
    assert ratings._ids["user"][0] is ratings.user_map
    assert not ratings._known_unique()  # the pairs are checked again where they must be


@pytest.mark.parametrize("copy_of", ["torch.save", "pickle", "copy", "deepcopy"])
def test_loaded_and_copied_ratings_still_check_an_assignment(copy_of):
    """A record made by __setstate__ (load, pickle, copy) checks a field assigned later as
    the constructed one does, and a refused assignment leaves it as it was."""
    import copy
    import pickle
    make = {"torch.save": _round_trip, "pickle": lambda r: pickle.loads(pickle.dumps(r)),
            "copy": copy.copy, "deepcopy": copy.deepcopy}[copy_of]
    original = _edited_ratings(lambda r: r.item_ids())
    ratings = make(original)
    ratings.rating = ratings.rating * 2
    with pytest.raises(ValueError, match=r"^Ratings\.user, \.item and \.rating must have one "
                                         r"length, got 3, 1 and 3; to change fields"):
        ratings.item = ratings.item[:1]
    assert ratings.item.tolist() == [0, 1, 0] and ratings.rating.tolist() == [8., 6., 10.]
    ratings.item_map = {7: 1, 9: 0}  # the same length, other indices: read again
    assert ratings.item_ids() == [9, 7]
    assert original.item_ids() == [7, 9] and original.rating.tolist() == [4., 3., 5.]


def _forged_unique(load):
    """Three ratings, user 10's of item 7 twice, whose pair memo claims no pair repeats, as
    a crafted or edited file could hold it: its tensor versions those ``load`` gives the
    loaded tensors (a loader writes them: a memo of the saved versions goes stale anyway)."""
    ratings = nnsparse.data.Ratings(torch.tensor([0, 0, 1]), torch.tensor([0, 0, 1]),
                                    torch.tensor([4., 3., 5.]), {10: 0, 42: 1}, {7: 0, 9: 1})
    version = load(torch.tensor([0]))._version
    ratings._unique = (ratings.user, ratings.item, version, version)
    return ratings


def _pickled(obj):
    import pickle
    return pickle.loads(pickle.dumps(obj))


# A loaded record takes no uniqueness memo from the file: kfold and the splits check its
# pairs again and refuse the repeat (else a repeated pair could land in both train and test).
# (id, the splitter)
SPLITTERS = [
    ("kfold", lambda r: next(nnsparse.models.kfold(r, k=2))),
    ("split_ratings", lambda r: nnsparse.data.split_ratings(r, 0.5)),
    ("random_split", lambda r: nnsparse.data.random_split(r, 0.3, 0.3)),
]


@pytest.mark.parametrize("load", [_round_trip, _pickled], ids=["torch.load", "pickle"])
@pytest.mark.parametrize("split", [s for _, s in SPLITTERS], ids=[i for i, _ in SPLITTERS])
def test_a_loaded_record_forging_unique_pairs_is_refused_by_the_splits(split, load):
    loaded = load(_forged_unique(load))
    assert not loaded._known_unique()
    with pytest.raises(ValueError, match=r"^ratings: 1 \(user, item\) pair rated more than "
                                         r"once, e.g. user 10 and item 7 \(2 ratings\); keep "
                                         r"one rating per pair$"):
        split(loaded)


# Not allow-listed: their state records "already checked", which a file must not claim.
REFUSED = {
    "SparseRowDataset": (_dataset, "SparseRowDataset"),
    "SparseRowBatch": (lambda: (lambda ds: ds.collate([ds[0], ds[1]]))(_dataset()),
                       "_rebuild_batch"),
    "LazyAdam": (lambda: nnsparse.optim.LazyAdam([nn.Parameter(torch.ones(2))]), "LazyAdam"),
    "Trainer": (lambda: nnsparse.models.Trainer(nnsparse.models.AutoRec(), epochs=1,
                                                 batch_size=2, lr=0.1), "Trainer"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_checked_or_stateful_objects_are_still_refused(name):
    make, global_name = REFUSED[name]
    obj = make()
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    with pytest.raises(Exception, match=global_name) as info:
        torch.load(buf)  # torch's default: weights_only=True
    assert "weights_only" in str(info.value)
    buf.seek(0)
    assert type(torch.load(buf, weights_only=False)) is type(obj)  # the trusted-file way


# What importing nnsparse allows that is not nnsparse's: the torch classes its criteria
# and modules hold (a criterion's loss and noise generator, KernelNet's ModuleList, a
# layer's state_dict hooks).  Nothing else is allowed by importing nnsparse.
FOREIGN = {"torch.nn.modules.module._WrappedHook", "torch._C.Generator",
           "torch.nn.modules.container.ModuleList"} | {
    f"torch.nn.modules.loss.{n}" for n in (
        "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
        "SoftMarginLoss", "KLDivLoss", "PoissonNLLLoss", "HingeEmbeddingLoss")}


def test_nnsparse_allows_no_other_foreign_class():
    from nnsparse._serialization import _safe_globals
    foreign = {f"{g.__module__}.{g.__qualname__}" for g in _safe_globals()
               if not g.__module__.startswith("nnsparse")}
    assert foreign == FOREIGN


class _UserResult(NamedTuple):
    value: torch.Tensor


@pytest.mark.parametrize("obj,name", [
    (nn.Linear(2, 2), "Linear"),
    (nn.Sequential(nn.Tanh()), "Sequential"),
    (_UserResult(torch.ones(1)), "_UserResult"),
    (fractions.Fraction(1, 2), "Fraction"),
], ids=["nn.Linear", "nn.Sequential", "user-namedtuple", "Fraction"])
def test_other_types_are_refused_as_without_nnsparse(obj, name):
    with pytest.raises(Exception, match=name):
        _round_trip(obj)
    state = _round_trip({"w": torch.ones(2), "n": [1, 2.5, "x"]})  # torch's own types load
    assert torch.equal(state["w"], torch.ones(2)) and state["n"] == [1, 2.5, "x"]


def _fitted_autorec():
    from nnsparse.models import AutoRec
    return AutoRec(hidden=4, epochs=1, validation_ratio=0.0).fit(_ratings(), verbose=False,
                                                                 progress=False)


# A fitted model's training matrix travels as _CsrParts (allow-listed): a file's parts are
# checked on load as a user's matrix, not trusted (predict's batches reached the kernels).
BAD_PARTS = {
    "column-beyond-width": (lambda p: p.col.__setitem__(0, 10 ** 6),
                            r"a saved model's training matrix column indices must be in "
                            r"\[0, 20\), got max 1000000"),
    "negative-column": (lambda p: p.col.__setitem__(0, -3),
                        r"column indices must be non-negative, got min -3"),
    "pointer-past-nnz": (lambda p: p.crow.__setitem__(-1, 10 ** 6),
                         r"crow_indices must end at nnz = 120"),
    # a pointer past nnz inside the rows (the last one right): torch's CSR constructor
    # took it, and the unchecked matrix crashed the process (segfault) before the check
    "inner-pointer-past-nnz": (lambda p: p.crow.__setitem__(3, 10 ** 6),
                               r"crow_indices must be non-decreasing"),
}


@pytest.mark.parametrize("name", list(BAD_PARTS))
def test_loaded_model_checks_its_training_matrix(name):
    from nnsparse.models.base import _CsrParts
    model = _fitted_autorec()
    x = model._input
    parts = _CsrParts(x.crow_indices().clone(), x.col_indices().clone(), x.values(),
                      tuple(x.shape))
    edit, match = BAD_PARTS[name]
    edit(parts)
    model.__dict__["_input"] = parts  # as torch.save writes a fitted model's matrix
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match=match):
        torch.load(buf)  # torch's default: weights_only=True


def test_loaded_model_predicts_as_saved():
    model = _fitted_autorec()
    loaded = _round_trip(model)
    assert loaded._input.layout == torch.sparse_csr
    assert torch.equal(loaded._input.to_dense(), model._input.to_dense())
    assert torch.equal(loaded.predict(_ratings()), model.predict(_ratings()))


# A SparseWeightLinear from a file holds a pattern never checked (torch's unpickler sets its
# buffers): a load_state_dict without crow/col (values only, strict=False) derived it and
# recorded it as checked, so forward skipped the check (a sparse input ran on column 10**6).
@pytest.mark.parametrize("col", [10 ** 6, -5])
def test_loaded_weight_pattern_is_checked_after_a_values_only_load(col):
    layer = nnsparse.SparseWeightLinear.random(100, 3, 0.05, seed=1)
    with torch.no_grad():
        layer.col[0] = col
    loaded = _round_trip(layer)
    values = loaded.values.detach().clone()
    match = r"SparseWeightLinear crow/col column indices must be (in \[0, 100\)|non-negative)"
    with pytest.raises(ValueError, match=match):
        loaded.load_state_dict({"values": values + 1}, strict=False)
    assert torch.equal(loaded.values, values)  # refused before the copy: nothing loaded
    parent = nn.Sequential(loaded)
    with pytest.raises(ValueError, match=match):
        parent.load_state_dict({"0.values": values + 1}, strict=False)
    assert torch.equal(loaded.values, values)
    x = torch.zeros(2, 100)
    x[0, 0] = 1
    with pytest.raises(ValueError, match=match):
        loaded(x.to_sparse())  # (not run on the unchecked pattern)


def test_weight_values_only_load_keeps_a_checked_pattern():
    layer = nnsparse.SparseWeightLinear.random(100, 3, 0.05, seed=1)
    loaded = _round_trip(layer)
    loaded.load_state_dict({"values": torch.ones(layer.nnz)}, strict=False)
    x = torch.rand(2, 100)
    assert torch.allclose(loaded(x.to_sparse()), loaded(x))
    assert loaded.__dict__["_pattern_key"] == loaded._pattern_key_now()


# What a file says of a layer's state that is no parameter or buffer: a layer is loaded
# without an optimiser in the backward (whatever object a file puts there) and with no
# record of a checked pattern.
FORGED_STATE = {
    "SparseLinearBatch": (CASES["SparseLinearBatch-sparse_grad"], "_row_update",
                          lambda: nnsparse.Densify(6)),
    "SparseOutputLinear": (CASES["SparseOutputLinear"], "_row_update",
                           lambda: nnsparse.DynamicSparseTensor()),
    "SparseWeightLinear": (CASES["SparseWeightLinear"], "_pattern_key",
                           lambda: (1, 2, 0, 3, 4, 0)),
}


@pytest.mark.parametrize("name", list(FORGED_STATE))
def test_loaded_layer_drops_a_forged_state(name, monkeypatch):
    make, key, forged = FORGED_STATE[name]
    layer = make()
    layer.__dict__[key] = forged()
    # as a crafted file holds it (the class's own __getstate__ writes none)
    monkeypatch.setattr(type(layer), "__getstate__", nn.Module.__getstate__)
    buf = io.BytesIO()
    torch.save(layer, buf)
    monkeypatch.undo()
    buf.seek(0)
    loaded = torch.load(buf)  # torch's default: weights_only=True
    assert loaded.__dict__[key] is None
