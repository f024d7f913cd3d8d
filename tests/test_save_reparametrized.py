"""RatingModel.save() of a fitted model that torch.nn.utils.prune or torch.nn.utils.parametrize
changed: refused, naming each changed entry and the call that makes the change permanent
(before, "hparams no longer describe the fitted network", which they did); after that call
the file round-trips the model's predictions; a refused save writes nothing and keeps the
model as it was; torch.save of the whole pruned model, offered by the message, works."""
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from nnsparse.data import split_ratings, synthetic_ratings
from nnsparse.models import AutoRec, KernelNet, RatingModel


class _Half(nn.Module):
    def forward(self, w):
        return w * 0.5


@pytest.fixture(scope="module")
def data():
    return split_ratings(synthetic_ratings(0, 60, 50, 1200), 0.2, seed=0)


def _l1(name, amount=0.3):
    return lambda m: prune.l1_unstructured(m.get_submodule(name), "weight", amount=amount)


def _twice(name):  # a PruningContainer: still one pruned entry
    return lambda m: (_l1(name)(m), _l1(name)(m))


def _mask(name):  # the transposed weight of SparseLinearBatch: l1_unstructured's view fails
    def apply(m):
        layer = m.get_submodule(name)
        mask = torch.rand(layer.weight.shape, generator=torch.Generator().manual_seed(0)) > 0.3
        prune.custom_from_mask(layer, "weight", mask)
    return apply


def _half(name, tensor="weight"):
    return lambda m: parametrize.register_parametrization(m.get_submodule(name), tensor, _Half())


def _quiet(apply):  # torch.nn.utils.weight_norm: "deprecated in favor of ...parametrizations"
    def run(m):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            apply(m)
    return run


def _weight_norm(name):  # the old hook API: weight_g and weight_v
    return _quiet(lambda m: torch.nn.utils.weight_norm(m.get_submodule(name)))


def _spectral_norm(name):  # the old hook API: weight_orig, weight_u and weight_v
    return lambda m: torch.nn.utils.spectral_norm(m.get_submodule(name))


def _new_weight_norm(name):  # parametrizations.weight.original0 and original1
    return lambda m: torch.nn.utils.parametrizations.weight_norm(m.get_submodule(name))


def _pruned(entry, module):
    return [f"{entry} is pruned (torch.nn.utils.prune: the state holds {entry}_orig and "
            f"{entry}_mask instead)",
            f"torch.nn.utils.prune.remove(model.get_submodule({module!r}), "
            f"{entry.rsplit('.', 1)[1]!r})"]


def _parametrized(module, tensor):
    return [f"{module}.{tensor} is parametrized (torch.nn.utils.parametrize: the state holds "
            f"{module}.parametrizations.{tensor}.original instead)",
            f"torch.nn.utils.parametrize.remove_parametrizations(model.get_submodule("
            f"{module!r}), {tensor!r})"]


def _hooked(entry, module, kind):
    tool, state, remove = dict(
        weight_norm=("is weight-normalized (torch.nn.utils.weight_norm", ("g", "v"),
                     "remove_weight_norm"),
        spectral_norm=("is spectrally normalized (torch.nn.utils.spectral_norm",
                       ("orig", "u", "v"), "remove_spectral_norm"))[kind]
    held = ", ".join(f"{entry}_{x}" for x in state[:-1]) + f" and {entry}_{state[-1]}"
    return [f"{entry} {tool}: the state holds {held} instead)",
            f"torch.nn.utils.{remove}(model.get_submodule({module!r}), "
            f"{entry.rsplit('.', 1)[1]!r})"]


WHOLE = "or save the whole model, torch.save(model, path)"
STATE = "or keep model.state_dict() and load it into a model given the same changes"

CASES = [  # (id, class, changes, message parts, the whole model's torch.save offered)
    ("autorec-decoder-l1", AutoRec, [_l1("decoder")], _pruned("decoder.weight", "decoder"),
     True),
    ("autorec-encoder-mask", AutoRec, [_mask("encoder")], _pruned("encoder.weight", "encoder"),
     True),
    ("autorec-pruned-twice", AutoRec, [_twice("decoder")],
     _pruned("decoder.weight", "decoder"), True),
    ("kernelnet-l1", KernelNet, [_l1("kernels.0")], _pruned("kernels.0.weight", "kernels.0"),
     True),
    ("kernelnet-parametrized", KernelNet, [_half("kernels.1")],
     _parametrized("kernels.1", "weight"), False),
    ("autorec-both", AutoRec, [_l1("decoder"), _half("encoder", "bias")],
     _pruned("decoder.weight", "decoder") + _parametrized("encoder", "bias"), False),
    # the old hook APIs change the state as prune does (their message said "hparams no
    # longer describe the fitted network"); torch.save of the whole model keeps them
    ("autorec-weight-norm", AutoRec, [_weight_norm("decoder")],
     _hooked("decoder.weight", "decoder", "weight_norm"), True),
    ("autorec-spectral-norm", AutoRec, [_spectral_norm("encoder")],
     _hooked("encoder.weight", "encoder", "spectral_norm"), True),
    ("kernelnet-weight-norm-and-l1", KernelNet, [_weight_norm("kernels.1"), _l1("kernels.0")],
     _pruned("kernels.0.weight", "kernels.0")
     + _hooked("kernels.1.weight", "kernels.1", "weight_norm"), True),
    # the parametrization with two originals names both
    ("autorec-new-weight-norm", AutoRec, [_new_weight_norm("decoder")],
     ["decoder.weight is parametrized (torch.nn.utils.parametrize: the state holds "
      "decoder.parametrizations.weight.original0 and "
      "decoder.parametrizations.weight.original1 instead)",
      "torch.nn.utils.parametrize.remove_parametrizations(model.get_submodule('decoder'), "
      "'weight')"], False),
]


def _fit(cls, train):
    torch.manual_seed(0)
    return cls(hidden=8, epochs=1, validation_ratio=0.0).fit(train, verbose=False,
                                                             progress=False)


@pytest.mark.parametrize("cls, changes, parts, whole", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_save_refuses_a_reparametrized_model_and_says_what_to_do(
        tmp_path, data, cls, changes, parts, whole):
    train, test = data
    model = _fit(cls, train)
    for change in changes:
        change(model)
    before = model.predict_entries(test.user, test.item)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "m.pt"
    with pytest.raises(ValueError) as info:
        model.save(path)
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}.save() cannot save a model whose weights "
                              f"torch changed: ")
    for part in parts:
        assert message.count(part) == 1, (part, message)
    assert "hparams no longer describe" not in message
    assert (WHOLE in message) == whole and (STATE in message) == (not whole)
    assert message.endswith("(nothing was written)")
    # nothing written, the model as it was
    assert not path.exists()
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(model.predict_entries(test.user, test.item), before)
    if whole:  # the offered torch.save of the whole model keeps the pruning
        torch.save(model, tmp_path / "whole.pt")
        again = torch.load(tmp_path / "whole.pt", weights_only=False)
        assert torch.equal(again.predict_entries(test.user, test.item), before)
    # the calls the message names make the change permanent: save() then round-trips
    for name, module in list(model.named_modules()):
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
            elif isinstance(hook, WeightNorm):
                torch.nn.utils.remove_weight_norm(module, hook.name)
            elif isinstance(hook, SpectralNorm):
                torch.nn.utils.remove_spectral_norm(module, hook.name)
        if parametrize.is_parametrized(module):
            for tensor in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, tensor)
    model.save(path)
    loaded = RatingModel.load(path)
    assert type(loaded) is cls
    assert torch.allclose(loaded.predict_entries(test.user, test.item), before, atol=1e-6)


def test_the_state_dict_route_for_a_parametrized_model(data):
    """The message's other way for a parametrized model: its state_dict, loaded into a model
    given the same parametrization (the fitted model of a save() without it)."""
    train, test = data
    model = _fit(KernelNet, train)
    plain = _fit(KernelNet, train)
    for m in (model, plain):
        _half("kernels.1")(m)
    with torch.no_grad():
        model.get_submodule("kernels.1").parametrizations.weight.original.mul_(0.9)
    plain.load_state_dict(model.state_dict())
    assert torch.equal(plain.predict_entries(test.user, test.item),
                       model.predict_entries(test.user, test.item))
