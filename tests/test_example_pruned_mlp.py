"""Smoke test of examples/pruned_mlp.py: tiny settings, every model trains and is reported."""
import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "pruned_mlp.py"
TINY = ["--samples", "2000", "--hidden", "64", "--epochs", "3", "--finetune-epochs", "1",
        "--batch-size", "32", "--no-progress"]


def _main():
    spec = importlib.util.spec_from_file_location("pruned_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_pruned_mlp_prints_every_model_beside_the_dense_one(capsys):
    result = _main()(TINY)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "test accuracy (400 samples, 10 classes, density 0.1):"
    names = ["dense", "pruned", "pruned+fine-tuned", "sparse from scratch"]
    assert list(result) == names and len(lines) == 1 + len(names)
    for line, name in zip(lines[1:], names):
        assert line.split()[:-3] == name.split()
        assert f"{result[name]:.3f}" in line
    # weight counts: 256*64 + 64*10 dense; 10 % of each layer kept by the pruning
    dense_count = 256 * 64 + 64 * 10
    assert f"({dense_count:,} weights)" in lines[1]
    assert f"({round(0.1 * 256 * 64) + round(0.1 * 64 * 10):,} weights)" in lines[2]
    # the models learn (the most frequent class is under 30 % of the labels;
    # 10 % density from scratch learns slowest)
    assert result["dense"] > 0.45
    assert result["pruned+fine-tuned"] > 0.45
    assert result["sparse from scratch"] > 0.2
