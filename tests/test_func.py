"""torch.func transforms over the parameters of every nnsparse layer (docs/compile_amp.md).

``torch.func.grad``, ``grad_and_value``, ``vjp`` and ``jacrev`` of a loss over
the parameters (through ``torch.func.functional_call``), with the sparse
batches plain torch sparse tensors captured by the function or passed to it,
must give ordinary autograd's loss and gradients.  Each name of
:data:`MODELS` builds a :class:`Case` (a model, its arguments and its loss);
each runs on COO (coalesced or not) and CSR batches, in float32 and float64,
under each transform.

``jacrev`` batches the backward with ``vmap``, which torch cannot do for a
sparse tensor: where one lies between the parameters and the loss (a
sparse-output decoder, a sparse matrix built from learnable values), the
cases use ``jacrev(..., chunk_size=1)``, torch's loop without ``vmap``; a
strict xfail keeps the plain call's failure on record.  A ``sparse_grad``
layer's sparse gradient cannot be stacked into a Jacobian at all, nor can a
CSR batch be passed to a transform as an argument (torch wraps every
argument): those combinations are left out of the matrix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, jacrev, vjp

import nnsparse
from nnsparse import _forms, _index
from tests.matrix import TOL, make_form, random_sparse_dense

ROWS, WIDTH, HIDDEN = 6, 14, 4
LAYOUTS = ["coo", "coo_uncoalesced", "csr"]
DTYPES = [torch.float32, torch.float64]
TRANSFORMS = ["grad", "grad_and_value", "vjp", "jacrev"]


def _dense(dtype: torch.dtype, seed: int = 0) -> Tensor:
    # an empty row (the first) and away-from-zero values, as tests/matrix.py draws them
    return random_sparse_dense(ROWS, WIDTH, 0.35, dtype=dtype,
                               generator=torch.Generator().manual_seed(seed), empty_rows=1)


def _values(out: Tensor) -> Tensor:
    """The specified values of a sparse result (any layout), differentiably."""
    if out.layout == torch.sparse_csr:
        return out.values()
    return out.coalesce().values()


def _sum_of_squares(out: Tensor) -> Tensor:
    return (out if out.layout == torch.strided else _values(out)).square().sum()


@dataclass
class Case:
    """A model, the arguments of its forward and the loss of its output."""

    model: nn.Module
    args: Tuple[Any, ...]
    loss: Callable[[Any], Tensor] = _sum_of_squares
    # a sparse tensor lies between the parameters and the loss: jacrev needs chunk_size=1
    sparse_graph: bool = False


class _SparseMM(nn.Module):
    """``sparse_mm`` of a COO matrix built from the learnable ``values`` with a learnable
    dense ``b``, sparse on the left or on the right."""

    index: Tensor

    def __init__(self, pattern: Tensor, p: int, dense_left: bool) -> None:
        super().__init__()
        coo = pattern.coalesce()
        self.register_buffer("index", coo.indices())
        self.size = tuple(coo.shape)
        self.values = nn.Parameter(coo.values().clone())
        rows = self.size[0] if dense_left else self.size[1]
        self.b = nn.Parameter(torch.randn(p, rows, dtype=coo.dtype) if dense_left
                              else torch.randn(rows, p, dtype=coo.dtype))
        self.dense_left = dense_left

    def forward(self) -> Tensor:
        a = torch.sparse_coo_tensor(self.index, self.values, self.size)
        return nnsparse.sparse_mm(self.b, a) if self.dense_left else nnsparse.sparse_mm(a, self.b)


class _CapturedMM(nn.Module):
    """``sparse_mm`` of a captured sparse matrix (2-D or batched 3-D) and a learnable ``b``."""

    def __init__(self, shape: Tuple[int, ...], dense_left: bool, dtype: torch.dtype) -> None:
        super().__init__()
        k = shape[-2] if dense_left else shape[-1]
        lead = shape[:-2]
        self.b = nn.Parameter(torch.randn(*lead, 3, k, dtype=dtype) if dense_left
                              else torch.randn(*lead, k, 3, dtype=dtype))
        self.dense_left = dense_left

    def forward(self, a: Any) -> Tensor:
        return nnsparse.sparse_mm(self.b, a) if self.dense_left else nnsparse.sparse_mm(a, self.b)


def _autoencoder(dtype: torch.dtype) -> nn.Module:
    return nnsparse.PatternSequential(nnsparse.SparseLinearBatch(WIDTH, HIDDEN, dtype=dtype),
                                      nn.Tanh(), nnsparse.SparseOutputLinear(HIDDEN, WIDTH,
                                                                             dtype=dtype))


def _criterion_case(name: str, dtype: torch.dtype, layout: str, dense: Tensor) -> Case:
    """The autoencoder trained by criterion ``name`` on ``dense``'s batch in ``layout``.

    ``prepare_input`` (the corruption) runs before the transform, as data
    preparation; the forward and the loss run inside it.
    """
    gen = torch.Generator().manual_seed(3)
    model = _autoencoder(dtype)
    x = make_form(dense, layout)
    if name == "SDAECriterion":  # dense data: the decoder's dense output, no pattern
        crit: Any = nnsparse.SDAECriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.3,
                                           noise_ratio=0.3, generator=gen)
        noisy = make_form(crit.prepare_input(dense), layout)
        return Case(model, (noisy,), lambda out: crit(out, dense))
    if name == "SparseCriterion":
        crit = nnsparse.SparseCriterion(nn.MSELoss())
    elif name == "SDAESparseCriterion":
        crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.3,
                                            noise_ratio=0.3, generator=gen)
    else:
        crit = nnsparse.MaskCriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.3, generator=gen)
    noisy = crit.prepare_input(x)
    return Case(model, (noisy, x), lambda out: crit(out, x), sparse_graph=True)


CRITERIA = ["SparseCriterion", "SDAECriterion", "SDAESparseCriterion", "MaskCriterion"]


def _case(name: str, layout: str, dtype: torch.dtype) -> Case:
    torch.manual_seed(0)
    dense = _dense(dtype)
    x = make_form(dense, layout)
    if name.startswith("SparseLinearBatch-"):
        mode = name.split("-", 1)[1]
        if mode == "sparse_grad":
            layer = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, sparse_grad=True, dtype=dtype)
            return Case(layer, (x,))
        return Case(nnsparse.SparseLinearBatch(WIDTH, HIDDEN, mode=mode, dtype=dtype), (x,))
    if name.startswith("SparseOutputLinear"):
        layer = nnsparse.SparseOutputLinear(HIDDEN, WIDTH, sparse_grad=name.endswith("sparse_grad"),
                                            dtype=dtype)
        h = torch.randn(ROWS, HIDDEN, dtype=dtype)
        return Case(layer, (h, x), sparse_graph=True)
    if name.startswith("SparseWeightLinear"):
        pattern = random_sparse_dense(HIDDEN, WIDTH, 0.4, dtype=dtype,
                                      generator=torch.Generator().manual_seed(2)).to_sparse()
        layer = nnsparse.SparseWeightLinear(pattern, dtype=dtype)
        if name.endswith("dense_input"):
            return Case(layer, (dense,))
        if name.endswith("nearly_dense"):  # more meetings than rows x in: densified first
            full = make_form(_dense(dtype).abs() + 1, layout)
            return Case(layer, (full,))
        return Case(layer, (x,))
    if name.startswith("sparse_mm-values"):
        # (COO for every layout: torch builds no CSR tensor from a transform's values)
        return Case(_SparseMM(x if layout != "csr" else dense.to_sparse(), 3,
                              dense_left=name.endswith("dense_left")), (), sparse_graph=True)
    if name.startswith("sparse_mm-captured"):
        if name.endswith("3d"):
            a = torch.stack([dense, 2 * dense.flip(0)])  # (batched CSR: one nnz per matrix)
            a = a.to_sparse_csr() if layout == "csr" else a.to_sparse()
            return Case(_CapturedMM(tuple(a.shape), False, dtype), (a,))
        left = name.endswith("dense_left")
        return Case(_CapturedMM(tuple(dense.shape), left, dtype), (x,))
    if name == "autoencoder-ValuesMap":  # the README's model: tanh of the decoder's values
        model = _autoencoder(dtype)
        model.append(nnsparse.ValuesMap(torch.tanh))
        crit = nnsparse.SparseCriterion(nn.MSELoss())
        return Case(model, (x, x), lambda out: crit(out, x), sparse_graph=True)
    if name.startswith("autoencoder-"):
        return _criterion_case(name.split("-", 1)[1], dtype, layout, dense)
    raise ValueError(name)


MODELS = (["SparseLinearBatch-sparse", "SparseLinearBatch-dense", "SparseLinearBatch-auto",
           "SparseLinearBatch-sparse_grad", "SparseOutputLinear", "SparseOutputLinear-sparse_grad",
           "SparseWeightLinear", "SparseWeightLinear-nearly_dense", "SparseWeightLinear-dense_input",
           "sparse_mm-values", "sparse_mm-values-dense_left", "sparse_mm-captured",
           "sparse_mm-captured-dense_left", "sparse_mm-captured-3d"]
          + [f"autoencoder-{c}" for c in CRITERIA] + ["autoencoder-ValuesMap"])


def _params(model: nn.Module) -> Dict[str, Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


def _autograd(case: Case) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The loss and its gradients by ordinary autograd (the reference)."""
    params = dict(case.model.named_parameters())
    loss = case.loss(case.model(*case.args))
    return loss.detach(), dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


def _transformed(case: Case, transform: str, passed: bool) -> Tuple[Any, Dict[str, Tensor]]:
    """The loss (None where the transform gives none) and gradients by ``transform``;
    the batches ``passed`` to the transformed function as arguments, or captured by it."""
    def loss(p: Dict[str, Tensor], *args: Any) -> Tensor:
        return case.loss(functional_call(case.model, p, args if passed else case.args))

    p = _params(case.model)
    args = case.args if passed else ()
    if transform == "grad":
        return None, grad(loss)(p, *args)
    if transform == "grad_and_value":
        g, value = grad_and_value(loss)(p, *args)
        return value, g
    if transform == "vjp":  # (vjp differentiates every argument: the batches are captured)
        value, back = vjp(loss, p)
        return value, back(torch.ones_like(value))[0]
    # jacrev of a scalar: the gradient; vmap cannot batch a backward through sparse tensors
    return None, jacrev(loss, chunk_size=1 if case.sparse_graph else None)(p, *args)


def _matrix():
    """Every (model, layout, dtype, transform, how) but those torch cannot do: a sparse
    gradient in a Jacobian (jacrev stacks the gradients), a CSR batch passed to a
    transform (torch wraps every argument, and cannot wrap a CSR tensor), a batch
    passed to vjp (which differentiates every argument: vjp's batches are captured)."""
    for name in MODELS:
        for layout in LAYOUTS:
            for dtype in DTYPES:
                for transform in TRANSFORMS:
                    for how in ("captured", "passed"):
                        if transform == "jacrev" and name.endswith("sparse_grad"):
                            continue
                        if how == "passed" and (layout == "csr" or transform == "vjp"):
                            continue
                        yield pytest.param(name, layout, dtype, transform, how, id="-".join(
                            (name, layout, str(dtype).split(".")[1], transform, how)))


@pytest.mark.parametrize("name, layout, dtype, transform, how", list(_matrix()))
def test_transform_gives_autograd_gradients(name, layout, dtype, transform, how):
    case = _case(name, layout, dtype)
    want_loss, want = _autograd(case)
    loss, got = _transformed(case, transform, how == "passed")
    if loss is not None:
        torch.testing.assert_close(loss, want_loss, **TOL[dtype])
    assert got.keys() == want.keys()
    for key, g in got.items():
        # a sparse gradient stays sparse, as autograd gives it (sparse_grad layers)
        assert g.layout == want[key].layout, key
        torch.testing.assert_close(g.to_dense(), want[key].to_dense(), **TOL[dtype], msg=key)


@pytest.mark.xfail(raises=NotImplementedError, strict=True,
                   reason="torch's vmap has no sparse tensors: jacrev's batched backward cannot "
                          "pass through a sparse output (use chunk_size=1)")
def test_jacrev_batched_backward_through_a_sparse_output():
    case = _case("autoencoder-SparseCriterion", "coo", torch.float64)
    jacrev(lambda p: case.loss(functional_call(case.model, p, case.args)))(_params(case.model))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_pattern_output_layout_inside_a_transform(layout):
    # torch holds no CSR tensor inside a transform: a CSR pattern gives a COO result
    # there, with the same entries and values; outside, the pattern's layout
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(HIDDEN, WIDTH, dtype=torch.float64)
    x, h = make_form(_dense(torch.float64), layout), torch.randn(ROWS, HIDDEN, dtype=torch.float64)
    seen = {}

    def loss(p):
        out = functional_call(layer, p, (h, x))
        seen["layout"] = out.layout
        seen["values"] = _values(out).detach()  # a wrapped tensor: compared below, unwrapped
        return _values(out).sum()

    grad(loss)(_params(layer))
    assert seen["layout"] == torch.sparse_coo
    assert layer(h, x).layout == x.layout
    outside = _values(layer(h, x)).detach()
    torch.testing.assert_close(torch.func.debug_unwrap(seen["values"]), outside)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["SDAESparseCriterion", "MaskCriterion"])
def test_prepare_input_inside_a_transform(name, layout):
    # the corruption drawn inside the transform too (a CSR batch comes back COO there)
    torch.manual_seed(0)
    model = _autoencoder(torch.float64)
    x = make_form(_dense(torch.float64), layout)
    crit = (nnsparse.SDAESparseCriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.3, noise_ratio=0.3)
            if name == "SDAESparseCriterion"
            else nnsparse.MaskCriterion(nn.MSELoss(), beta=0.5, hide_ratio=0.3))

    def loss(p):
        crit.generator = torch.Generator().manual_seed(3)  # the same draws each call
        return crit(functional_call(model, p, (crit.prepare_input(x), x)), x)

    params = dict(model.named_parameters())
    want = torch.autograd.grad(loss(params), list(params.values()))
    got = grad(loss)(_params(model))
    for key, w in zip(params, want):
        torch.testing.assert_close(got[key], w, msg=key)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_structure_cache_survives_a_transform(layout):
    # a batch checked before the transform keeps its attached structure: the transform
    # neither replaces it nor stores its own (wrapped, short-lived) tensors in it, and
    # the ordinary step after it reads the cache without checking the batch again
    torch.manual_seed(0)
    model = _autoencoder(torch.float64)
    x = make_form(_dense(torch.float64), layout)
    crit = nnsparse.SparseCriterion(nn.MSELoss())
    before = crit(model(x, x), x)
    found = _forms._attached(x)
    assert found is not None

    grad(lambda p: crit(functional_call(model, p, (x, x)), x))(_params(model))

    assert _forms._attached(x) is found
    cache = found.pattern.cache
    for t in (cache.crow, cache.coo_indices, *(cache.column_major or ()),
              *(u for v in cache.column_major_all.values() for u in v)):
        if t is not None:
            assert _index.data_ptr(t) is not None  # a plain tensor, none of the transform's
    _forms._reset_counts()
    after = crit(model(x, x), x)
    assert _forms._counts().get("validate", 0) == 0
    torch.testing.assert_close(after, before)


def test_data_ptr_of_a_transform_tensor():
    x = torch.tensor([[0., 1.], [2., 0.]]).to_sparse()
    assert _index.data_ptr(x._indices()) == x._indices().data_ptr()
    seen = []

    def f(w):
        seen.append(_index.data_ptr(x._indices()))  # functorch's wrapper: no storage
        seen.append(_index.data_ptr(w))
        return w.sum()

    grad(f)(torch.ones(2))
    assert seen == [None, None]


@pytest.mark.parametrize("layer", ["SparseLinearBatch", "SparseOutputLinear"])
@pytest.mark.parametrize("transform", ["grad", "vjp"])
def test_in_backward_optimizer_refused(layer, transform):
    torch.manual_seed(0)
    x = make_form(_dense(torch.float32), "coo")
    if layer == "SparseLinearBatch":
        module: nn.Module = nnsparse.SparseLinearBatch(WIDTH, HIDDEN)
        args: Tuple[Any, ...] = (x,)
    else:
        module = nnsparse.SparseOutputLinear(HIDDEN, WIDTH)
        args = (torch.randn(ROWS, HIDDEN), x)
    model = nnsparse.PatternSequential(module)
    opt = nnsparse.optim.apply_optimizer_in_backward(model, "adam", lr=0.1)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def loss(p):
        return _sum_of_squares(functional_call(model, p, args))

    run = grad(loss) if transform == "grad" else (lambda p: vjp(loss, p))
    message = (rf"{layer} '0': the optimiser in the backward \(nnsparse\.optim\."
               r"apply_optimizer_in_backward\) updates the weight in place during the backward, "
               r"which a torch\.func transform \(grad, grad_and_value, vjp, jacrev, vmap\) "
               r"cannot do: there the weight is the transform's tensor, not the layer's\. Train "
               r"with ordinary autograd \(loss\.backward\(\)\), or call remove\(\) on the "
               r"in-backward optimiser before using torch\.func")
    with pytest.raises(NotImplementedError, match=message):
        run(_params(model))
    for k, v in model.state_dict().items():  # nothing was updated
        torch.testing.assert_close(v, weights[k])
    opt.remove()  # the fix the message names: torch.func works again
    got = grad(loss)(_params(model))
    want = torch.autograd.grad(loss(dict(model.named_parameters())), list(model.parameters()))
    for g, w in zip(got.values(), want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("layer", ["SparseLinearBatch", "SparseOutputLinear"])
def test_sparse_parts_refused_inside_a_transform(layer):
    # torch.library.register_autograd's autograd has no torch.func support (torch 2.13):
    # the compile input path says so, and names the tensor path, which works
    torch.manual_seed(0)
    x = make_form(_dense(torch.float64), "csr")
    parts = nnsparse.sparse_parts(x)
    if layer == "SparseLinearBatch":
        module: nn.Module = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, dtype=torch.float64)
        args: Tuple[Any, ...] = (parts,)
        tensor_args: Tuple[Any, ...] = (x,)
    else:
        module = nnsparse.SparseOutputLinear(HIDDEN, WIDTH, dtype=torch.float64)
        h = torch.randn(ROWS, HIDDEN, dtype=torch.float64)
        args, tensor_args = (h, parts), (h, x)

    def loss(p, args):
        out = functional_call(module, p, args)
        return (out.values if isinstance(out, nnsparse.SparseParts) else
                out if out.layout == torch.strided else _values(out)).square().sum()

    # (the batches captured: a CSR argument of a transform cannot even be wrapped by torch)

    message = (r"a SparseParts batch \(the torch\.compile input path\) cannot be used inside a "
               r"torch\.func transform: torch's custom operators \(torch\.library\."
               r"register_autograd\) do not support torch\.func transforms; give the layers the "
               r"torch sparse tensor itself \(the batch, or parts\.to_sparse_csr\(\)\)")
    with pytest.raises(NotImplementedError, match=message):
        grad(lambda p: loss(p, args))(_params(module))
    got = grad(lambda p: loss(p, tensor_args))(_params(module))
    params = dict(module.named_parameters())
    want = torch.autograd.grad(loss(params, args), list(params.values()))  # the parts, eagerly
    for key, w in zip(params, want):
        torch.testing.assert_close(got[key], w, msg=key)
