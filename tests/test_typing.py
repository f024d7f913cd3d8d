"""The package is typed: py.typed ships, SparseLike is public and used in signatures."""
import inspect
import pathlib
import typing

import nnsparse


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
