"""The package is typed: py.typed ships, SparseLike is public and used in signatures, and
the overloads (ssort, ssort_by_index, predict_entries) say what the calls return: checked
by mypy on snippets, and at run time for the sorts."""
import inspect
import pathlib
import subprocess
import sys
import typing

import pytest
import torch

import nnsparse
from nnsparse import SortResult


def test_py_typed_ships():
    assert (pathlib.Path(nnsparse.__file__).parent / "py.typed").is_file()
    setup = (pathlib.Path(__file__).resolve().parent.parent / "setup.cfg").read_text()
    assert "nnsparse = py.typed" in setup


def test_sparse_like_is_public_and_used():
    assert "SparseLike" in nnsparse.__all__
    for fn in (nnsparse.densify, nnsparse.to_pairs, nnsparse.ssort, nnsparse.stopk,
               nnsparse.values_map, nnsparse.SparseCriterion.forward,
               nnsparse.SDAESparseCriterion.prepare_input, nnsparse.Densify.forward):
        hints = typing.get_type_hints(fn)
        sparse_args = [n for n in ("x", "input", "target") if n in inspect.signature(fn).parameters]
        # values_map takes the torch.compile form too (a SparseParts gives a SparseParts)
        want = (typing.Union[nnsparse.SparseLike, nnsparse.SparseParts]
                if fn is nnsparse.values_map else nnsparse.SparseLike)
        assert sparse_args and all(hints[n] == want for n in sparse_args), fn


# What the type checker infers of nnsparse's calls, each pinned with typing's assert_type
# and checked by mypy (with setup.cfg's strict settings) on a snippet: the overloads must
# say what each call returns at run time.
_SNIPPET_HEAD = """\
from typing import List, Sequence, Tuple, Union
import torch
from torch import Tensor
from typing_extensions import assert_type
import nnsparse
from nnsparse import SortResult

t = torch.zeros(2, 2)
rows: List[Tensor] = [t, t]
row_tuple: Tuple[Tensor, ...] = (t, t)
flag = bool(t.sum())
"""

# Written out once per function, not as a loop over (ssort, ssort_by_index): mypy types
# such a loop variable by one of the two, so the other's overloads went unchecked.
_SORT_SNIPPET = """\
assert_type(SORT(t), Union[SortResult, Tensor])
assert_type(SORT(t, True), Union[SortResult, Tensor])
assert_type(SORT(t, inplace=False), Union[SortResult, Tensor])
assert_type(SORT(rows), Union[SortResult, List[Tensor]])
assert_type(SORT(row_tuple, descending=True), Union[SortResult, List[Tensor]])
# inplace=True gives back x itself: its own type, a tuple as a tuple
assert_type(SORT(t, inplace=True), Tensor)
assert_type(SORT(t, False, True), Tensor)
assert_type(SORT(rows, inplace=True), List[Tensor])
assert_type(SORT(row_tuple, True, True), Tuple[Tensor, ...])
assert_type(SORT(t, inplace=flag), Union[SortResult, Tensor, Sequence[Tensor]])
"""

_SORTS = ["ssort", "ssort_by_index"]


def _mypy(tmp_path, body):
    """mypy's report on the snippet, run from the repository root (this copy of nnsparse
    is found first) with setup.cfg's settings; '' when it passes."""
    pytest.importorskip("mypy")
    root = pathlib.Path(__file__).resolve().parent.parent
    snippet = tmp_path / "snippet.py"
    snippet.write_text(_SNIPPET_HEAD + body)
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(root / "setup.cfg"),
                          "--no-error-summary", str(snippet)],
                         cwd=root, capture_output=True, text=True, timeout=600)
    return run.stdout + run.stderr if run.returncode else ""


@pytest.mark.parametrize("sort", _SORTS)
def test_sort_return_types_by_mypy(tmp_path, sort):
    assert _mypy(tmp_path, _SORT_SNIPPET.replace("SORT", f"nnsparse.{sort}")) == ""


# What the overloads above claim, checked at run time for each input form and flag: a
# torch sparse tensor or a list/tuple of sparse vectors gives a SortResult; a pair tensor
# a pair tensor; a list/tuple of pair tensors a new list; inplace=True x itself.
def _pairs():
    return torch.tensor([[3., 1.], [1., 4.]])


def _vector():
    return torch.sparse_coo_tensor([[1, 3]], [4., 1.], (5,))


RUNTIME = [
    ("sparse", _vector, {}, SortResult),
    ("csr-batch", lambda: torch.eye(2).to_sparse_csr(), {}, SortResult),
    ("vector-list", lambda: [_vector(), _vector()], {}, SortResult),
    ("vector-tuple", lambda: (_vector(), _vector()), {"descending": True}, SortResult),
    ("pairs", _pairs, {}, torch.Tensor),
    ("pair-list", lambda: [_pairs(), _pairs()], {}, list),
    ("pair-tuple", lambda: (_pairs(), _pairs()), {"inplace": False}, list),
    ("pairs-inplace", _pairs, {"inplace": True}, "x"),
    ("pair-list-inplace", lambda: [_pairs(), _pairs()], {"inplace": True}, "x"),
    ("pair-tuple-inplace", lambda: (_pairs(), _pairs()), {"inplace": True}, "x"),
]


@pytest.mark.parametrize("sort", _SORTS)
@pytest.mark.parametrize("make, kwargs, want", [r[1:] for r in RUNTIME],
                         ids=[r[0] for r in RUNTIME])
def test_sort_runtime_types_match_the_overloads(sort, make, kwargs, want):
    x = make()
    out = getattr(nnsparse, sort)(x, **kwargs)
    if want == "x":
        assert out is x
    else:
        assert type(out) is want
        if want is list:
            assert all(type(row) is torch.Tensor for row in out)


def test_mypy_snippet_check_catches_a_wrong_type(tmp_path):
    # the check above can fail: a wrong claim is reported
    assert "assert-type" in _mypy(tmp_path, "assert_type(nnsparse.ssort(t, inplace=True), int)\n")


_PREDICT_SNIPPET = """\
from typing import Dict
from nnsparse.models import RatingModel

def check(model: RatingModel, users: Tensor, items: Tensor) -> None:
    assert_type(model.predict_entries(users, items), Tensor)
    assert_type(model.predict_entries(users, items, False), Tensor)
    assert_type(model.predict_entries(users, items, return_counts=True),
                Tuple[Tensor, Dict[str, int]])
    assert_type(model.predict_entries(users, items, return_counts=flag),
                Union[Tensor, Tuple[Tensor, Dict[str, int]]])
"""


def test_predict_entries_return_types_by_mypy(tmp_path):
    assert _mypy(tmp_path, _PREDICT_SNIPPET) == ""


def test_python_floor_is_one_in_setup_cfg():
    # python_requires, mypy's python_version and the version classifiers say one floor
    import configparser
    import re
    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).resolve().parent.parent / "setup.cfg")
    floor = cfg["mypy"]["python_version"]
    assert cfg["options"]["python_requires"] == f">={floor}"
    versions = re.findall(r"Programming Language :: Python :: (3\.\d+)",
                          cfg["metadata"]["classifiers"])
    as_tuple = lambda v: tuple(map(int, v.split(".")))  # noqa: E731
    assert versions and min(versions, key=as_tuple) == floor
    assert sys.version_info[:2] >= as_tuple(floor)
