"""The ninth bad-input probe (docs/bad_inputs_probe9.md): nnsparse.optim's state dicts,
parameter groups and kinds, SplitOptimizer's torch.optim protocol, clip_grad_norm_'s
max_norm, the synthetic generators' sizes and the item files.

Each row pairs a call with the exception and a regex of its message (``error=None``:
the call must work, and ``check`` its result).  Rows that load a state also check that
a refused load changed nothing (validate before mutate).
"""
import copy
import os
import pickle
from typing import Any, Callable, List, Optional

import pytest
import torch
from torch import nn

from probe_cases import Case, run_case
import nnsparse
from nnsparse.data import read_item_features, read_ratings, synthetic_item_features, \
    synthetic_ratings
from nnsparse.optim import LazyAdam, apply_optimizer_in_backward, clip_grad_norm_



# -- LazyAdam.load_state_dict ----------------------------------------------------------------

def _stepped(cls: type = LazyAdam, **kw: Any):
    """A 3 -> 2 linear layer and an optimiser of ``cls`` after one step."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = cls(model.parameters(), lr=0.1, **kw)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def _load_refused(edit: Callable[[dict], Any], source: Optional[Callable[[], Any]] = None):
    """Load into a stepped LazyAdam the state ``edit`` made of a stepped optimiser's state
    dict (``source``'s, LazyAdam's by default); return the LazyAdam's state afterwards
    with the one before, for the check that nothing changed."""
    def call():
        model, opt = _stepped()
        given = copy.deepcopy((source() if source else opt).state_dict())
        edited = edit(given)
        given = given if edited is None else edited
        before = copy.deepcopy(opt.state_dict())
        try:
            opt.load_state_dict(given)
        finally:
            after = opt.state_dict()
            assert _same_state(before, after), "a refused load changed the optimiser"
    return call


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


def _set(path: List[Any], value: Any) -> Callable[[dict], None]:
    def edit(sd: dict) -> None:
        target = sd
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _nadam_state():
    return _stepped(torch.optim.NAdam)[1]


def _rekeyed(sd: dict) -> None:
    """Ids 1 and 0 for the weight and the bias (torch maps the groups' ids in order)."""
    sd["param_groups"][0]["params"] = [1, 0]
    sd["state"] = {1: sd["state"][0], 0: sd["state"][1]}


def _loads_rekeyed():
    model, opt = _stepped()
    sd = copy.deepcopy(opt.state_dict())
    _rekeyed(sd)
    torch.manual_seed(1)
    other = nn.Linear(3, 2)
    fresh = LazyAdam(other.parameters())
    fresh.load_state_dict(sd)
    return (torch.equal(fresh.state[other.weight]["exp_avg"], opt.state[model.weight]["exp_avg"])
            and torch.equal(fresh.state[other.bias]["exp_avg"], opt.state[model.bias]["exp_avg"]))


LOAD_CASES = [
    Case("lazy-load-nadam-state", _load_refused(lambda sd: None, _nadam_state), ValueError,
         r"state_dict\['state'\]\[0\] holds \['mu_product'\], which LazyAdam does not keep "
         r"\(it keeps \['exp_avg', 'exp_avg_sq', 'step'\]\): the state of another optimiser"),
    Case("lazy-load-entry-for-no-parameter",
         _load_refused(lambda sd: sd["state"].__setitem__(7, sd["state"][0])), ValueError,
         r"state_dict\['state'\] has an entry 7 for no parameter: the ids of "
         r"state_dict\['param_groups'\] are \[0, 1\]"),
    Case("lazy-load-str-key", _load_refused(lambda sd: sd["state"].__setitem__(
        "0", sd["state"].pop(0))), ValueError, r"has an entry '0' for no parameter"),
    Case("lazy-load-entry-not-dict", _load_refused(_set(["state", 0], [1, 2])), TypeError,
         r"state_dict\['state'\]\[0\] must be a dict of state name -> value, got list"),
    Case("lazy-load-id-twice", _load_refused(_set(["param_groups", 0, "params"], [0, 0])),
         ValueError, r"state_dict\['param_groups'\] must name each parameter id once, got 0 "
                     r"twice"),
    Case("lazy-load-params-str", _load_refused(_set(["param_groups", 0, "params"], "ab")),
         TypeError, r"state_dict\['param_groups'\]\[0\]\['params'\] must be a list of "
                    r"parameter ids \(from Optimizer.state_dict\(\)\), got str"),
    Case("lazy-load-params-unhashable",
         _load_refused(_set(["param_groups", 0, "params"], [[0], [1]])), TypeError,
         r"state_dict\['param_groups'\]\[0\]\['params'\]\[0\] must be a parameter id "
         r"\(an int\), got list"),
    Case("lazy-load-negative-exp-avg-sq", _load_refused(
        lambda sd: sd["state"][0].__setitem__("exp_avg_sq", -1 - sd["state"][0]["exp_avg_sq"])),
         ValueError, r"state_dict\['state'\]\[0\]\['exp_avg_sq'\] must be non-negative \(a sum "
                     r"of squared gradients\), got min -1"),
    Case("lazy-load-betas-of-one", _load_refused(_set(["param_groups", 0, "betas"], (0.9,))),
         ValueError, r"state_dict\['param_groups'\]\[0\]: betas must be a pair \(beta1, beta2\), "
                     r"got \(0.9,\)"),
    Case("lazy-load-dense-above-2", _load_refused(_set(["param_groups", 0, "dense_above"], 2)),
         ValueError, r"state_dict\['param_groups'\]\[0\]: dense_above must be None or in "
                     r"\[0, 1\], got 2"),
    # must work: ids other than the positions, mapped as torch maps them (refused before)
    Case("lazy-load-ids-not-positions", _loads_rekeyed, None, check=lambda ok: ok),
    # must work: torch's Adam state (its float32 step tensor) loads
    Case("lazy-load-torch-adam-state", lambda: LazyAdam(nn.Linear(3, 2).parameters())
         .load_state_dict(_stepped(torch.optim.Adam)[1].state_dict()), None,
         check=lambda out: out is None),
]


# -- SplitOptimizer, make_optimizer, apply_optimizer_in_backward ----------------------------

def _split_model():
    torch.manual_seed(0)
    return nn.Sequential(nnsparse.SparseLinearBatch(6, 3, sparse_grad=True), nn.Linear(3, 2))


_X = torch.eye(6)[:2].to_sparse()
_W = nn.Parameter(torch.zeros(2, 3))


def _stepped_split():
    model = _split_model()
    opt = nnsparse.make_optimizer(model, lr=0.1)
    model(_X).sum().backward()
    opt.step()
    return model, opt


def _split_copy(make: Callable[[Any], Any]):
    """Copy a stepped (model, optimiser) pair together; step the copy; the copy's
    parameters move and the original's do not."""
    def call():
        model, opt = _stepped_split()
        before = [p.detach().clone() for p in model.parameters()]
        model2, opt2 = make((model, opt))
        opt2.zero_grad()
        model2(_X).sum().backward()
        opt2.step()
        return (type(opt2) is nnsparse.SplitOptimizer
                and all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
                and any(not torch.equal(p, b) for p, b in zip(model2.parameters(), before)))
    return call


def _split_hooks():
    model, opt = _stepped_split()
    seen = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("pre"))
    opt.register_state_dict_post_hook(lambda o, sd: seen.append("post"))
    opt.register_load_state_dict_pre_hook(lambda o, sd: seen.append("load-pre"))
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load-post"))
    opt.load_state_dict(opt.state_dict())
    return seen


def _split_with_amsgrad_part():
    """A hand-built split whose dense part is Adam(amsgrad=True): its state's
    max_exp_avg_sq loads back."""
    model = _split_model()
    opt = nnsparse.SplitOptimizer({
        "dense": torch.optim.Adam(model[1].parameters(), amsgrad=True),
        "sparse": LazyAdam(model[0].parameters())})
    model(_X).sum().backward()
    opt.step()
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    return "max_exp_avg_sq" in opt.state_dict()["dense"]["state"][0]


def _ib_negative_sum():
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 3))
    opt = apply_optimizer_in_backward(model, "rowwise_adagrad", lr=0.1)
    model(_X).sum().backward()
    sd = copy.deepcopy(opt.state_dict())
    sd["tables"]["0"]["sum"] = sd["tables"]["0"]["sum"] - 1
    before = copy.deepcopy(opt.state_dict())
    try:
        opt.load_state_dict(sd)
    finally:
        assert _same_state(before, opt.state_dict())


def _replaced_param(value: Any):
    def call():
        model, opt = _stepped()
        opt.param_groups[0]["params"][0] = value
        weight = model.bias.detach().clone()
        model.bias.grad = torch.ones(2)
        try:
            opt.step()
        finally:
            assert torch.equal(model.bias.detach(), weight), "a refused step changed a parameter"
    return call


def _split_shared_after_add_param_group():
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 3), nn.Linear(3, 2))
    first, second = torch.optim.Adam(model[0].parameters()), torch.optim.Adam(model[1].parameters())
    opt = nnsparse.SplitOptimizer({"first": first, "second": second})
    second.add_param_group({"params": list(model[0].parameters())})
    _refused_step_changes_nothing(model, opt)


def _split_replaced():
    model, opt = _stepped_split()
    opt.optimizers["dense"].param_groups[0]["params"][0] = "weight"
    _refused_step_changes_nothing(model, opt)


def _refused_step_changes_nothing(model, opt):
    """A backward, then ``opt.step()`` (expected to raise): no parameter may change."""
    model(_X).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt.step()
    finally:
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


OPTIM_CASES = [
    Case("make_optimizer-maximize-with-sparse-part",
         lambda: nnsparse.make_optimizer(_split_model(), maximize=True), NotImplementedError,
         r"dense_kwargs: maximize=True would apply to the dense parameters only: the "
         r"sparse-gradient parameters' optimiser \('lazy_adam'\) has no maximize"),
    Case("make_optimizer-amsgrad-with-sparse-part",
         lambda: nnsparse.make_optimizer(_split_model(), amsgrad=True), NotImplementedError,
         r"dense_kwargs: amsgrad=True would apply to the dense parameters only"),
    Case("make_optimizer-differentiable-with-sparse-part",
         lambda: nnsparse.make_optimizer(_split_model(), sparse="sparse_adam",
                                         differentiable=True), NotImplementedError,
         r"optimiser \('sparse_adam'\) has no differentiable"),
    Case("make_optimizer-maximize-all-dense", lambda: nnsparse.make_optimizer(
        nn.Linear(3, 2), maximize=True), None,
         check=lambda opt: type(opt) is torch.optim.Adam and opt.param_groups[0]["maximize"]),
    Case("make_optimizer-dense-none", lambda: nnsparse.make_optimizer(_split_model(), dense=None),
         TypeError, r"dense must be one of \('adam', 'adamw'\) \(a str\), got NoneType None"),
    Case("make_optimizer-sparse-class", lambda: nnsparse.make_optimizer(
        _split_model(), sparse=torch.optim.SparseAdam), TypeError,
         r"sparse must be one of \('lazy_adam', 'sparse_adam'\) \(a str\), got type"),
    Case("apply_optimizer_in_backward-none", lambda: apply_optimizer_in_backward(
        nn.Sequential(nnsparse.SparseLinearBatch(6, 3)), None), TypeError,
         r"optimizer must be one of \('sgd', 'adam', 'adamw', 'adagrad', "
         r"'rowwise_adagrad'\) \(a str\), got NoneType None"),
    Case("apply_optimizer_in_backward-class", lambda: apply_optimizer_in_backward(
        nn.Sequential(nnsparse.SparseLinearBatch(6, 3)), torch.optim.Adam), TypeError,
         r"optimizer must be one of .* \(a str\), got type <class 'torch.optim.adam.Adam'>"),
    Case("in-backward-load-negative-rowwise-sum", _ib_negative_sum, ValueError,
         r"state_dict\['tables'\]\['0'\]\['sum'\] must be non-negative \(a sum of squared "
         r"gradients\), got min -1"),
    Case("split-deepcopy", _split_copy(copy.deepcopy), None, check=lambda ok: ok),
    Case("split-pickle", _split_copy(lambda pair: pickle.loads(pickle.dumps(pair))), None,
         check=lambda ok: ok),
    Case("split-state-dict-hooks", _split_hooks, None,
         check=lambda seen: seen == ["pre", "post", "load-pre", "load-post"]),
    Case("split-parameter-shared-after-add_param_group", _split_shared_after_add_param_group,
         RuntimeError, r"optimizers\['first'\] and optimizers\['second'\] share a parameter "
                       r"of shape \(3, 6\) \(added to one since the SplitOptimizer was built\): "
                       r"each step would update it twice"),
    Case("split-step-param-replaced-by-str", _split_replaced, TypeError,
         r"optimizers\['dense'\].param_groups\[0\]\['params'\]\[0\] must be a tensor, "
         r"got str"),
    Case("split-amsgrad-part-state-loads", _split_with_amsgrad_part, None, check=lambda ok: ok),
    # torch's named form, (name, parameter) pairs, passed LazyAdam's own checks by
    Case("lazy-named-params-twice", lambda: LazyAdam([("a", _W), ("b", _W)]), ValueError,
         r"params must name each parameter once, got the same tensor at positions 0 and 1 "
         r"\(each step would update it twice\)"),
    Case("lazy-named-params-int", lambda: LazyAdam([("a", torch.zeros(2, dtype=torch.long))]),
         TypeError, r"params must be floating-point tensors \(Adam's moments\), got torch.int64 "
                    r"at position 0"),
    Case("lazy-named-params-sparse", lambda: LazyAdam([("a", torch.zeros(2, 2).to_sparse())]),
         TypeError, r"params must be dense \(strided\) tensors, got layout torch.sparse_coo at "
                    r"position 0"),
    Case("lazy-named-params-in-group-twice", lambda: LazyAdam(
        [{"params": [("a", _W), ("b", _W)]}]), ValueError, r"params must name each parameter once"),
    Case("lazy-named-params-work", lambda: LazyAdam(nn.Linear(3, 2).named_parameters()), None,
         check=lambda opt: opt.param_groups[0]["param_names"] == ["weight", "bias"]),
    Case("lazy-zero_grad-str", lambda: _stepped()[1].zero_grad("no"), TypeError,
         r"set_to_none must be a bool, got str 'no'"),
    Case("lazy-zero_grad-tensor", lambda: _stepped()[1].zero_grad(torch.ones(2, 3)), TypeError,
         r"set_to_none must be a bool, got Tensor"),
    Case("lazy-zero_grad-false", lambda: (lambda mo: (mo[1].zero_grad(False), mo[0].weight.grad)[1])(
        _stepped()), None, check=lambda grad: grad is not None and not grad.any()),
    Case("lazy-step-param-replaced-by-str", _replaced_param("weight"), TypeError,
         r"param_groups\[0\]\['params'\]\[0\] must be a floating-point tensor, got str"),
    Case("lazy-step-param-replaced-by-int-tensor",
         _replaced_param(torch.zeros(2, 3, dtype=torch.long)), TypeError,
         r"param_groups\[0\]\['params'\]\[0\] must be a floating-point tensor, got torch.int64"),
]


# -- clip_grad_norm_ -------------------------------------------------------------------------

def _clip(max_norm: Any, **kw: Any):
    def call():
        model = nn.Linear(3, 2)
        model(torch.ones(1, 3)).sum().backward()
        grad = model.weight.grad.clone()
        done = False
        try:
            out = clip_grad_norm_(model.parameters(), max_norm, **kw), model.weight.grad
            done = True
            return out
        finally:
            if not done:
                assert torch.equal(model.weight.grad, grad), "a refused clip scaled a gradient"
    return call


CLIP_CASES = [
    Case("clip-max-norm-nan", _clip(float("nan")), ValueError,
         r"max_norm must be non-negative, got nan"),
    Case("clip-max-norm-negative", _clip(-1.0), ValueError,
         r"max_norm must be non-negative, got -1.0"),
    Case("clip-norm-type-nan", lambda: _clip(1.0, norm_type=float("nan"))(), ValueError,
         r"norm_type must be a number or inf, got nan"),
    Case("clip-max-norm-zero", _clip(0.0), None,
         check=lambda out: bool((out[1] == 0).all())),
]


# -- data: synthetic sizes and item files ------------------------------------------------------

_FLAGS = "|".join(["0"] * 18 + ["1"])


def _item_file(tmp: Any, name: str, text: str):
    path = tmp / name
    path.write_text(text)
    return path


def _features(name: str, text: str, fmt: str, item_map: dict):
    return lambda tmp: read_item_features(_item_file(tmp, name, text), fmt, item_map)


def _csv_titles(tmp: Any, movies: str):
    _item_file(tmp, "movies.csv", movies)
    ratings = _item_file(tmp, "ratings.csv", "userId,movieId,rating,timestamp\n1,1,4,0\n1,2,3,0\n")
    return read_ratings(ratings, "csv").titles


DATA_CASES = [
    Case("synthetic-ratings-cells-beyond-memory", lambda tmp: synthetic_ratings(
        n_users=10 ** 9, n_items=10 ** 9, n_ratings=10), ValueError,
         r"n_users=1000000000, n_items=1000000000, rank=10 need about .* GiB to generate "
         r"\(the generator is dense: about 50 bytes a \(user, item\) cell\), more than this "
         r"machine's .* GiB of memory"),
    Case("synthetic-ratings-rank-beyond-memory", lambda tmp: synthetic_ratings(
        n_users=10, n_items=10, n_ratings=10, rank=10 ** 12), ValueError,
         r"rank=1000000000000 need about .* GiB to generate"),
    Case("synthetic-item-features-beyond-memory", lambda tmp: synthetic_item_features(
        0, n_items=10 ** 12), ValueError,
         r"n_items=1000000000000 need about .* GiB to generate \(the generator is dense: "
         r"about 100 bytes an item\)"),
    Case("synthetic-ratings-small-works", lambda tmp: synthetic_ratings(
        n_users=5, n_items=4, n_ratings=12), None, check=lambda r: len(r) == 12),
    Case("u.item-flag-2", _features("u.item", f"1|T|d||u|{_FLAGS[:-1]}2\n", "ml-100k", {1: 0}),
         ValueError, r"u.item, line 1: the genre flags must be 0 or 1, got '2'"),
    Case("u.item-flag-negative", _features("u.item", f"1|T|d||u|-1|{_FLAGS[2:]}\n", "ml-100k",
                                           {1: 0}),
         ValueError, r"u.item, line 1: the genre flags must be 0 or 1, got '-1'"),
    Case("u.item-flag-half", _features("u.item", f"1|T|d||u|{_FLAGS[:-1]}0.5\n", "ml-100k",
                                       {1: 0}),
         ValueError, r"the genre flags must be 0 or 1, got '0.5'"),
    Case("movies.csv-without-header-keeps-first-item", _features(
        "movies.csv", "1,A,Comedy\n2,B,Drama\n", "csv", {1: 0, 2: 1}), None,
         check=lambda f: f.tolist() == [[1.0, 0.0], [0.0, 1.0]]),
    Case("movies.csv-with-header", _features(
        "movies.csv", "movieId,title,genres\n1,A,Comedy\n", "csv", {1: 0}), None,
         check=lambda f: f.tolist() == [[1.0]]),
    Case("movies.csv-only-header", _features("movies.csv", "movieId,title,genres\n", "csv",
                                             {1: 0}),
         ValueError, r"movies.csv: holds no entries \(an empty file, or a header line only\)"),
    Case("movies.csv-without-header-titles", lambda tmp: _csv_titles(
        tmp, "1,A (1995),Comedy\n2,B (1996),Drama\n"), None,
         check=lambda titles: titles == ["A (1995)", "B (1996)"]),
]



@pytest.mark.parametrize("case", LOAD_CASES + OPTIM_CASES + CLIP_CASES, ids=lambda c: c.id)
def test_probe9_optim(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", DATA_CASES, ids=lambda c: c.id)
def test_probe9_data(case: Case, tmp_path: Any) -> None:
    if "beyond-memory" in case.id and not hasattr(os, "sysconf"):
        pytest.skip("the memory check reads the POSIX sysconf; this system has none")
    run_case(case, tmp_path)

