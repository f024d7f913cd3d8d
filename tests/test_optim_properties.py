"""Property-based tests of nnsparse's optimisers against a step-by-step reference.

Hypothesis draws a small model (a ``SparseLinearBatch`` encoder, a
``SparseOutputLinear`` decoder, or both), a sequence of 1-5 sparse batches whose
touched rows vary (none of a table, one, all, any subset), the hyperparameters and
``dense_above``.  The reference (``_reference``) is plain torch arithmetic written
from the documented semantics (``docs/fused_step.md``, *Lazy rows and the dense
fallback*, *Weight decay*, *Adagrad and SGD*; ``LazyAdam``'s docstring):

* a table's rows touched by a step are updated by the kind's formula; the other rows
  and their state are left as they are (lazy), unless the step touches more than
  ``dense_above`` of the rows: then every row takes the step with a zero gradient;
* weight decay is plainly lazy (no catch-up): L2 in the gradient, or AdamW's
  decoupled shrink, on the rows a step updates;
* a table's ``step`` (Adam's bias correction) advances at every step, touched or not;
* parameters outside the backward (biases) take torch's dense step of the same kind
  (row-wise Adagrad: element-wise Adagrad);
* ``LazyAdam`` (and ``make_optimizer``'s) is lazy on sparse gradients
  (``sparse_grad=True`` layers), the biases included: the decoder's touched at the
  pattern's columns, the encoder's at every output when the batch has rows; on dense
  gradients it is Adam.

Each optimiser also runs through the paths a step may take: blocks of a few rows
(``_CHUNK`` lowered), spans, and the GPU's synchronisation-free masked step on CPU.

Gradients come from a copy of the model with dense gradients (``sparse_grad=False``,
no optimiser attached), all computed before any update of the step.
"""
import copy
import io

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

import nnsparse
from nnsparse import _rowopt
from nnsparse import optim as noptim
from matrix import make_form
from test_optim_backward import _torch_optimizer

SETTINGS = settings(max_examples=40)  # the rest: the profile of tests/conftest.py
TOL = dict(rtol=1e-7, atol=1e-10)  # float64; the kernels round in other orders
KINDS = ("sgd", "adam", "adamw", "adagrad", "rowwise_adagrad")
# each optimiser under test: "backward:<kind>" is apply_optimizer_in_backward
MODES = tuple(f"backward:{k}" for k in KINDS) + ("fused", "lazy_adam", "lazy_adamw",
                                                 "make_adam", "make_adamw")


# -- the model and its batches -------------------------------------------------------------
class _Net(nn.Module):
    """``arch``: "ae" (encoder -> tanh -> sampled decoder), "enc" or "dec" alone."""

    def __init__(self, arch, sizes, bias, sparse_grad):
        super().__init__()
        n_in, hidden, n_out = sizes
        self.enc = self.dec = None
        if arch in ("ae", "enc"):
            self.enc = nnsparse.SparseLinearBatch(n_in, hidden, bias=bias,
                                                  sparse_grad=sparse_grad)
        if arch in ("ae", "dec"):
            self.dec = nnsparse.SparseOutputLinear(hidden, n_out, bias=bias,
                                                   sparse_grad=sparse_grad)

    def loss(self, batch):
        x, h, y, target = batch
        if self.enc is not None:
            h = torch.tanh(self.enc(x))
        if self.dec is None:
            return (h - target).square().sum()
        out = self.dec(h, y)
        return (torch.tanh(out.values()) - y.values()).square().sum()

    def tables(self):
        """Layer name -> the view of its weight whose rows a batch touches."""
        found = {}
        for name in ("enc", "dec"):
            layer = getattr(self, name)
            if layer is not None:
                table = layer._table() if name == "enc" else layer.weight
                found[name] = table
        return found

    def named_state(self):
        """The trained tensors, by a name independent of ``sparse_grad``."""
        out = {}
        for name, table in self.tables().items():
            out[f"{name}.table"] = table.detach().clone()
            bias = getattr(self, name).bias
            if bias is not None:
                out[f"{name}.bias"] = bias.detach().clone()
        return out


def _pattern(gen, rows, width, cols):
    """A ``(rows, width)`` float64 COO batch whose specified columns are exactly ``cols``."""
    keep = torch.zeros(rows, width, dtype=torch.bool)
    for c in cols:
        in_col = torch.rand(rows, generator=gen) < 0.5
        in_col[int(torch.randint(rows, (1,), generator=gen))] = True
        keep[:, c] = in_col
    sign = torch.where(torch.rand(rows, width, generator=gen) < 0.5, -1.0, 1.0)
    values = (torch.rand(rows, width, generator=gen, dtype=torch.float64) + 0.5) * sign
    return torch.where(keep, values, torch.zeros((), dtype=torch.float64)).to_sparse()


def _columns(width):
    """Touched columns: none, every one, a single one, any subset."""
    return st.one_of(st.just(()), st.just(tuple(range(width))),
                     st.integers(0, width - 1).map(lambda c: (c,)),
                     st.sets(st.integers(0, width - 1)).map(lambda s: tuple(sorted(s))))


@st.composite
def scenarios(draw, full=False):
    """A model and 1-5 batches; ``full``: every batch touches every row of every table."""
    arch = draw(st.sampled_from(["ae", "enc", "dec"]))
    sizes = tuple(draw(st.integers(1, 8)) for _ in range(3))
    rows = draw(st.integers(1 if full else 0, 4))  # a batch of no rows touches nothing
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        x_cols = tuple(range(sizes[0])) if full else draw(_columns(sizes[0])) if rows else ()
        y_cols = tuple(range(sizes[2])) if full else draw(_columns(sizes[2])) if rows else ()
        steps.append((x_cols, y_cols, draw(st.integers(0, 2 ** 16))))
    form = draw(st.sampled_from(["coo", "coo_uncoalesced", "csr"] + (["list"] if rows else [])))
    return dict(arch=arch, sizes=sizes, rows=rows, bias=draw(st.booleans()), steps=steps,
                seed=draw(st.integers(0, 2 ** 16)), form=form)


def _batches(sc, plain=False):
    """Each step's ``(x, h, y, target)`` and touched columns; the encoder's input ``x`` in
    the scenario's form (duplicate entries, CSR, a list of rows), or ``plain`` COO."""
    n_in, hidden, n_out = sc["sizes"]
    out = []
    for x_cols, y_cols, seed in sc["steps"]:
        gen = torch.Generator().manual_seed(seed)
        x = _pattern(gen, sc["rows"], n_in, x_cols)
        y = _pattern(gen, sc["rows"], n_out, y_cols)
        h = torch.randn(sc["rows"], hidden, generator=gen, dtype=torch.float64)
        target = torch.rand(sc["rows"], hidden, generator=gen, dtype=torch.float64) - 0.5
        form = "coo" if plain or (sc.get("form") == "coo_uncoalesced" and not x._nnz()) \
            else sc.get("form", "coo")
        x = make_form(x.to_dense(), form)
        out.append(((x, h, y, target), set(x_cols), set(y_cols)))
    return out


def _model(sc, sparse_grad):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sc["seed"])
        return _Net(sc["arch"], sc["sizes"], sc["bias"], False).double() if not sparse_grad \
            else _with_sparse_grad(_Net(sc["arch"], sc["sizes"], sc["bias"], False).double(), sc)


def _with_sparse_grad(dense, sc):
    model = _Net(sc["arch"], sc["sizes"], sc["bias"], True).double()
    model.load_state_dict(dense.state_dict())
    return model


# -- hyperparameters -----------------------------------------------------------------------
_LR = st.one_of(st.just(0.0), st.floats(1e-3, 0.5))
_DECAY = st.one_of(st.just(0.0), st.floats(1e-3, 0.3))
_BETAS = st.tuples(st.floats(0.0, 0.95), st.floats(0.0, 0.999))
_EPS = st.sampled_from([1e-8, 1e-6, 1e-3, 0.1])
_DENSE_ABOVE = st.one_of(st.sampled_from([None, 0.0, 0.25, 0.5, 1.0]), st.floats(0.0, 1.0))


@st.composite
def hypers(draw):
    """Every kind's hyperparameters; :func:`_hp` keeps those of the optimiser under test."""
    return dict(lr=draw(_LR), weight_decay=draw(_DECAY), betas=draw(_BETAS), eps=draw(_EPS),
                momentum=draw(st.sampled_from([0.0, 0.5, 0.9, 0.95])), nesterov=draw(st.booleans()),
                initial_accumulator_value=draw(st.sampled_from([0.0, 0.1])))


def _hp(mode, raw):
    """The keyword arguments of ``mode``'s constructor (``dense_above`` apart)."""
    kind = _kind(mode)
    hp = dict(lr=raw["lr"], weight_decay=raw["weight_decay"])
    if kind in ("adam", "adamw"):
        hp.update(betas=raw["betas"], eps=raw["eps"])
    elif kind == "sgd":
        hp.update(momentum=raw["momentum"], nesterov=raw["nesterov"] and bool(raw["momentum"]))
    else:
        hp.update(eps=raw["eps"], initial_accumulator_value=raw["initial_accumulator_value"])
    return hp


def _kind(mode):
    if mode.startswith("backward:"):
        return mode.split(":")[1]
    return "adamw" if mode.endswith("adamw") else "adam"


def _optimizer(mode, model, hp, dense_above):
    kind = _kind(mode)
    if mode.startswith("backward:"):
        return noptim.apply_optimizer_in_backward(model, kind, dense_above=dense_above, **hp)
    if mode == "fused":
        return noptim.fused_step_optimizer(model, dense_above=dense_above, **hp)
    adam = {k: hp[k] for k in ("lr", "betas", "eps", "weight_decay")}
    if mode.startswith("lazy"):
        return noptim.LazyAdam(model.parameters(), dense_above=dense_above,
                               decoupled_weight_decay=kind == "adamw", **adam)
    return nnsparse.make_optimizer(model, dense=kind, **adam)


# -- the reference -------------------------------------------------------------------------
def _ref_state(kind, table, hp):
    n = table.shape[0]
    init = hp.get("initial_accumulator_value", 0.0)
    if kind == "sgd":
        return {"step": 0, "momentum_buffer": torch.zeros_like(table)}
    if kind in ("adam", "adamw"):
        return {"step": 0, "exp_avg": torch.zeros_like(table),
                "exp_avg_sq": torch.zeros_like(table)}
    if kind == "adagrad":
        return {"step": 0, "sum": torch.full_like(table, init)}
    return {"step": 0, "sum": torch.full((n,), init, dtype=table.dtype)}


def _ref_step(kind, hp, lr, p, g, rows, state):
    """One documented step of the rows ``rows`` (bool mask) of the 2-D view ``p``."""
    state["step"] += 1
    if not bool(rows.any()):
        return
    wd = hp.get("weight_decay", 0.0)
    x, gr = p[rows].clone(), g[rows].clone()
    if kind == "adamw":
        x = x * (1 - lr * wd)
    elif wd:
        gr = gr + wd * x
    if kind == "sgd":
        mom = hp.get("momentum", 0.0)
        if mom:
            buf = state["momentum_buffer"][rows] * mom + gr
            state["momentum_buffer"][rows] = buf
            gr = gr + mom * buf if hp.get("nesterov") else buf
        x = x - lr * gr
    elif kind in ("adam", "adamw"):
        (b1, b2), t = hp["betas"], state["step"]
        m = b1 * state["exp_avg"][rows] + (1 - b1) * gr
        v = b2 * state["exp_avg_sq"][rows] + (1 - b2) * gr * gr
        state["exp_avg"][rows], state["exp_avg_sq"][rows] = m, v
        x = x - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + hp["eps"])
    elif kind == "adagrad":
        s = state["sum"][rows] + gr * gr
        state["sum"][rows] = s
        x = x - lr * gr / (s.sqrt() + hp["eps"])
    else:  # rowwise_adagrad: one accumulator per row, the mean of its squared gradient
        acc = state["sum"][rows] + (gr * gr).mean(1)
        state["sum"][rows] = acc
        x = x - lr * gr / (acc.sqrt() + hp["eps"]).unsqueeze(1)
    p[rows] = x


def _reference(sc, mode, hp, dense_above, sparse_grad, lrs=None, edits=None):
    """The final parameters and table states of ``mode`` run on ``sc``, as documented
    (``lrs``: each step's learning rate; ``edits``: each step's changes to ``hp``)."""
    kind = _kind(mode)
    model = _model(sc, False)
    backward = mode.startswith("backward") or mode == "fused"
    # LazyAdam and make_optimizer are lazy on sparse gradients, Adam on dense ones
    lazy_table = backward or sparse_grad
    lazy_bias = not backward and sparse_grad  # the biases' gradients are sparse too
    if mode.startswith("make"):
        dense_above = None  # make_optimizer's LazyAdam: always lazy
    states = {}
    for i, (batch, x_cols, y_cols) in enumerate(_batches(sc, plain=True)):
        lr = hp["lr"] if lrs is None else lrs[i]
        step_hp = hp if edits is None else dict(hp, **edits[i])
        lr = step_hp["lr"] if edits is not None else lr
        model.zero_grad(set_to_none=True)
        model.loss(batch).backward()
        with torch.no_grad():
            for name, table in model.tables().items():
                layer = getattr(model, name)
                grad = layer.weight.grad.t() if name == "enc" else layer.weight.grad
                cols = x_cols if name == "enc" else y_cols
                touched = torch.zeros(table.shape[0], dtype=torch.bool)
                touched[list(cols)] = True
                if not lazy_table:
                    touched[:] = True
                parts = [("table", table, grad, touched)]
                if layer.bias is not None and layer.bias.grad is not None:
                    # the decoder's bias: the pattern's columns; the encoder's: every
                    # output, if the batch has rows
                    bias_touched = touched if name == "dec" else \
                        torch.full_like(layer.bias, sc["rows"] > 0, dtype=torch.bool)
                    if not lazy_bias:
                        bias_touched = torch.ones_like(layer.bias, dtype=torch.bool)
                    parts.append(("bias", layer.bias.view(-1, 1), layer.bias.grad.view(-1, 1),
                                  bias_touched))
                for part, p, g, rows in parts:
                    key = f"{name}.{part}"
                    k = "adagrad" if kind == "rowwise_adagrad" and part == "bias" else kind
                    if key not in states:
                        states[key] = _ref_state(k, p, hp)
                    share = dense_above if (part == "table" and lazy_table) or (
                        part == "bias" and lazy_bias) else None
                    n = rows.shape[0]
                    if share is not None and int(rows.sum()) > share * n:
                        rows = torch.ones_like(rows)
                    _ref_step(k, step_hp, lr, p, g, rows, states[key])
    return model.named_state(), states


# -- running the optimiser under test ------------------------------------------------------
def _run(sc, mode, hp, dense_above, sparse_grad=False, *, lrs=None, edits=None,
         split_at=None, resume="state_dict", sync_free=False, chunk=None):
    """Train ``sc``'s model with ``mode``; ``lrs``: per-step learning rates set by a
    LambdaLR; ``split_at``: after that many steps, go on with a copy: a fresh model,
    optimiser and scheduler loaded from the saved state dicts (``resume="state_dict"``,
    or ``"last_epoch"``: the scheduler built after the optimiser's load, with
    ``last_epoch``), or ``copy.deepcopy`` of the three together (``"deepcopy"``);
    ``edits``: each step's changes written into every param group before its forward
    (as OneCycleLR writes ``lr`` and ``betas`` or ``momentum``)."""
    with pytest.MonkeyPatch.context() as mp:
        if sync_free:  # the GPU's step, on CPU
            mp.setattr(nnsparse._kernels, "_SYNC_FREE", ("cpu",))
        if chunk is not None:  # blocks of a few rows: the blocked paths on tiny tables
            mp.setattr(_rowopt, "_CHUNK", chunk)
            mp.setattr(noptim, "_CHUNK", chunk)
        model = _model(sc, sparse_grad)
        opt = _optimizer(mode, model, hp, dense_above)
        sched = None
        if lrs is not None:
            factors = [lr / hp["lr"] for lr in lrs]

            def schedule(o, last_epoch=-1):
                return torch.optim.lr_scheduler.LambdaLR(
                    o, lambda e: factors[min(e, len(lrs) - 1)], last_epoch=last_epoch)
            sched = schedule(opt)
        for i, (batch, _, _) in enumerate(_batches(sc)):
            if split_at == i and resume == "deepcopy":
                old = opt
                model, opt, sched = copy.deepcopy((model, opt, sched))
                if hasattr(old, "remove"):
                    old.remove()
            elif split_at == i:
                saved = io.BytesIO()
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict() if sched else None}, saved)
                saved.seek(0)
                loaded = torch.load(saved, weights_only=False)
                if hasattr(opt, "remove"):
                    opt.remove()
                model = _model(dict(sc, seed=sc["seed"] + 1), sparse_grad)  # other values
                model.load_state_dict(loaded["model"])
                opt = _optimizer(mode, model, hp, dense_above)
                if sched is not None and resume == "state_dict":
                    sched = schedule(opt)  # torch's order: before the optimiser's load
                opt.load_state_dict(loaded["opt"])
                if sched is not None and resume == "state_dict":
                    sched.load_state_dict(loaded["sched"])
                elif sched is not None:
                    sched = schedule(opt, last_epoch=i - 1)
            if edits is not None:
                for group in opt.param_groups:
                    group.update(edits[i])
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
            if sched is not None:
                sched.step()
    return model, opt


def _state_of(mode, model, opt):
    """The optimiser state of each table (and LazyAdam's of each bias), by name."""
    out = {}
    for name, table in model.tables().items():
        layer = getattr(model, name)
        if mode.startswith("backward:") or mode == "fused":
            out[f"{name}.table"] = opt.tables[name]
            continue
        param = layer.weight_t if name == "enc" and layer.sparse_grad else layer.weight
        flip = name == "enc" and not layer.sparse_grad  # (out, in): the table's transpose
        out[f"{name}.table"] = {k: v.t() if flip and torch.is_tensor(v) and v.dim() else v
                                for k, v in opt.state[param].items()}
        if layer.bias is not None:
            out[f"{name}.bias"] = {k: v.view(-1, 1) if torch.is_tensor(v) and v.dim() else v
                                   for k, v in opt.state[layer.bias].items()}
    return out


def _assert_params(got, expected, what):
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], **TOL,
                                   msg=lambda m: f"{what} {key}: {m}")


def _assert_same_states(got, expected, what):
    """Two runs' optimiser states (:func:`_state_of`) are equal."""
    assert got.keys() == expected.keys()
    for key, entry in got.items():
        assert entry.keys() == expected[key].keys(), f"{what} {key}"
        for name, value in entry.items():
            ref = expected[key][name]
            if torch.is_tensor(value) and value.dim():
                torch.testing.assert_close(value, ref, **TOL, msg=f"{what} {key} {name}")
            else:
                assert float(value) == float(ref), f"{what} {key} {name}"


def _assert_states(got, expected, what):
    for key, state in got.items():
        ref = expected[key]
        for name, value in state.items():
            if name == "step":
                assert float(value) == ref["step"], f"{what} {key} step"
            else:
                torch.testing.assert_close(value, ref[name], **TOL,
                                           msg=lambda m: f"{what} {key} {name}: {m}")


# -- the properties ------------------------------------------------------------------------
# Found by this test: a SparseLinearBatch(sparse_grad=True)'s bias gradient dropped its
# exact zeros (here every entry: the batch gives the loss nothing), so LazyAdam skipped the
# bias's weight decay and moments where the entries were touched
_RAW = dict(lr=0.1, weight_decay=0.0, betas=(0.0, 0.0), eps=1e-8, momentum=0.0, nesterov=False,
            initial_accumulator_value=0.0)
_BIAS_ZERO_GRAD = dict(arch="ae", sizes=(1, 1, 1), rows=1, bias=True, steps=[((), (), 0)],
                       seed=0)


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(sc=scenarios(), raw=hypers(), dense_above=_DENSE_ABOVE, sparse_grad=st.booleans(),
       sync_free=st.booleans(), chunk=st.sampled_from([None, 1, 3]))
@example(sc=_BIAS_ZERO_GRAD, raw=dict(_RAW, lr=0.0, weight_decay=0.25), dense_above=None,
         sparse_grad=True, sync_free=False, chunk=None)
def test_every_optimiser_equals_the_documented_lazy_reference(mode, sc, raw, dense_above,
                                                             sparse_grad, sync_free, chunk):
    """Lazy rows, the dense step above ``dense_above``, lazy decay without catch-up, a
    table's step count per backward: parameters and state as the reference's, on any
    sequence of batches (whatever path the update takes: blocks, spans, GPU's masked)."""
    hp = _hp(mode, raw)
    if mode.startswith("make"):
        dense_above = None
    model, opt = _run(sc, mode, hp, dense_above, sparse_grad, sync_free=sync_free,
                      chunk=chunk)
    params, states = _reference(sc, mode, hp, dense_above, sparse_grad)
    what = f"{mode} dense_above={dense_above}"
    _assert_params(model.named_state(), params, what)
    _assert_states(_state_of(mode, model, opt), states, what)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "backward:rowwise_adagrad"])
@SETTINGS
@given(sc=scenarios(full=True), raw=hypers(), dense_above=_DENSE_ABOVE,
       sparse_grad=st.booleans())
@example(sc=dict(_BIAS_ZERO_GRAD, rows=2, steps=[((0,), (0,), 0)] * 3),  # a saturated tanh
         raw=dict(_RAW, lr=0.5, betas=(0.5, 0.0)), dense_above=None, sparse_grad=True)
def test_every_row_touched_equals_torch_optim(mode, sc, raw, dense_above, sparse_grad):
    """With every row touched at every step, each optimiser is torch's of its kind."""
    hp = _hp(mode, raw)
    model, _ = _run(sc, mode, hp, dense_above, sparse_grad)
    ref = _model(sc, False)
    ref_opt = _torch_optimizer(_kind(mode), ref.parameters(), hp)
    for batch, _, _ in _batches(sc):
        ref_opt.zero_grad()
        ref.loss(batch).backward()
        ref_opt.step()
    _assert_params(model.named_state(), ref.named_state(), mode)


def _neutral(mode, hp):
    kind = _kind(mode)
    return not hp["weight_decay"] and (kind in ("adagrad", "rowwise_adagrad")
                                       or (kind == "sgd" and not hp["momentum"]))


@pytest.mark.parametrize("mode", [m for m in MODES if not m.startswith("make")])  # no dense_above
@SETTINGS
@given(sc=scenarios(), raw=hypers(), sparse_grad=st.booleans(), full=st.booleans())
def test_lazy_and_dense_paths_agree(mode, sc, raw, sparse_grad, full):
    """Where the documented results coincide (every row touched, or a kind a zero gradient
    leaves unchanged), every ``dense_above`` and the GPU's masked step give the same
    parameters and state."""
    hp = _hp(mode, raw)
    if full or not (mode.startswith("backward") and _neutral(mode, hp)):
        sc = dict(sc, rows=max(1, sc["rows"]),
                  steps=[(tuple(range(sc["sizes"][0])), tuple(range(sc["sizes"][2])), s)
                         for _, _, s in sc["steps"]])
    runs = [(None, False), (0.0, False), (1.0, False), (0.3, False), (None, True), (0.0, True)]
    if not mode.startswith("backward"):
        runs = [r for r in runs if not r[1]]
    results = []
    for dense_above, sync_free in runs:
        model, opt = _run(sc, mode, hp, dense_above, sparse_grad, sync_free=sync_free)
        results.append((model.named_state(), _state_of(mode, model, opt)))
    for (dense_above, sync_free), (params, state) in zip(runs[1:], results[1:]):
        what = f"{mode} dense_above={dense_above} sync_free={sync_free}"
        _assert_params(params, results[0][0], what)
        _assert_same_states(state, results[0][1], what)


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(data=st.data(), sc=scenarios(), raw=hypers(), dense_above=_DENSE_ABOVE,
       sparse_grad=st.booleans(), split=st.integers(1, 4),
       resume=st.sampled_from(["state_dict", "last_epoch", "deepcopy"]), scheduled=st.booleans())
def test_state_dict_round_trip_mid_sequence(mode, data, sc, raw, dense_above, sparse_grad, split,
                                            resume, scheduled):
    """Saving after step k and going on in a fresh model, optimiser (and LR scheduler)
    loaded from the state dicts, or in a deep copy of them, gives the uninterrupted
    run's parameters and optimiser state."""
    hp = _hp(mode, dict(raw, lr=0.1))
    split = min(split, len(sc["steps"]))
    lrs = data.draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 0.5)), min_size=len(
        sc["steps"]), max_size=len(sc["steps"]))) if scheduled else None
    whole, whole_opt = _run(sc, mode, hp, dense_above, sparse_grad, lrs=lrs)
    resumed, opt = _run(sc, mode, hp, dense_above, sparse_grad, lrs=lrs, split_at=split,
                        resume=resume)
    what = f"{mode} resumed at {split} by {resume}, lrs={lrs}"
    _assert_params(resumed.named_state(), whole.named_state(), what)
    _assert_same_states(_state_of(mode, resumed, opt), _state_of(mode, whole, whole_opt), what)


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(sc=scenarios(), raw=hypers(), dense_above=_DENSE_ABOVE, sparse_grad=st.booleans())
def test_zero_learning_rate_changes_no_parameter(mode, sc, raw, dense_above, sparse_grad):
    hp = _hp(mode, dict(raw, lr=0.0))
    model, _ = _run(sc, mode, hp, dense_above, sparse_grad)
    _assert_params(model.named_state(), _model(sc, False).named_state(), f"{mode} lr=0")


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(data=st.data(), sc=scenarios(), raw=hypers(), dense_above=_DENSE_ABOVE,
       sparse_grad=st.booleans())
def test_scheduled_learning_rates_are_honoured(mode, data, sc, raw, dense_above, sparse_grad):
    """A LambdaLR changing the learning rate between steps: each step takes its own."""
    hp = _hp(mode, dict(raw, lr=0.1))
    lrs = data.draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 0.5)),
                             min_size=len(sc["steps"]), max_size=len(sc["steps"])))
    if mode.startswith("make"):
        dense_above = None
    model, _ = _run(sc, mode, hp, dense_above, sparse_grad, lrs=lrs)
    params, _ = _reference(sc, mode, hp, dense_above, sparse_grad, lrs=lrs)
    _assert_params(model.named_state(), params, f"{mode} lrs={lrs}")


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(data=st.data(), sc=scenarios(), raw=hypers(), dense_above=_DENSE_ABOVE,
       sparse_grad=st.booleans())
def test_param_group_edits_between_steps_are_honoured(mode, data, sc, raw, dense_above,
                                                      sparse_grad):
    """``lr`` and ``betas`` / ``momentum`` written into every param group before a step
    (OneCycleLR's way) are that step's, in the backward's groups as in the others."""
    hp = _hp(mode, raw)
    if mode.startswith("make"):
        dense_above = None
    kind, edits = _kind(mode), []
    for _ in sc["steps"]:
        edit = dict(lr=data.draw(_LR))
        if kind in ("adam", "adamw"):
            edit["betas"] = (data.draw(st.floats(0.0, 0.95)), hp["betas"][1])
        elif kind == "sgd":
            edit["momentum"] = data.draw(st.one_of(st.just(0.0), st.floats(0.1, 0.95)))
        edits.append(edit)
    model, _ = _run(sc, mode, hp, dense_above, sparse_grad, edits=edits)
    params, _ = _reference(sc, mode, hp, dense_above, sparse_grad, edits=edits)
    _assert_params(model.named_state(), params, f"{mode} edits={edits}")
