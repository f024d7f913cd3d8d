"""The README's examples are part of the test suite: every ``>>>`` line must run as shown,
and every other ``python`` block runs too (training shortened, see ``SHORTER``)."""
import doctest
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
# Blocks without ``>>>`` run as written, but for these substitutions, which only make a
# training shorter (a README fit trains for about a minute).
SHORTER = {"KernelNet()": "KernelNet(hidden=8, epochs=2, refit=False)"}


def _plain_python_blocks():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return [block for block in blocks if ">>>" not in block]


def test_readme_examples_run():
    result = doctest.testfile(str(README), module_relative=False,
                              optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0, "the README lost its examples"
    assert result.failed == 0


def test_readme_has_plain_blocks():
    assert _plain_python_blocks(), "the README lost its model-zoo snippet; drop this test"


@pytest.mark.parametrize("index", range(len(_plain_python_blocks())))
def test_readme_plain_python_blocks_run(index, capsys):
    source = _plain_python_blocks()[index]
    for long, short in SHORTER.items():
        source = source.replace(long, short)
    state = torch.random.get_rng_state()
    try:
        exec(compile(source, f"README.md python block {index}", "exec"), {})
    finally:
        torch.random.set_rng_state(state)
    printed = capsys.readouterr().out
    # the comments that show printed dicts name their keys: the code must print them
    for comment in re.findall(r"#\s*(\{.*\})", _plain_python_blocks()[index]):
        for key in re.findall(r"'(\w+)'", comment):
            assert f"'{key}'" in printed, (key, printed[-300:])
