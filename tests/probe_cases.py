"""The row type and runner of the bad-input probe tables (tests/test_bad_inputs_probe*.py).

Each row pairs a call with the exception it must raise and a regex of its message, or,
with ``error=None``, a call that must work and a ``check`` of its result.
"""
from typing import Any, Callable, NamedTuple, Optional

import pytest


class Case(NamedTuple):
    id: str
    call: Callable[..., Any]
    error: Optional[type]
    match: str = ""
    check: Optional[Callable[[Any], bool]] = None


def run_case(case: Case, *args: Any) -> None:
    """Call ``case.call(*args)``: it raises ``case.error`` matching ``case.match``, or, with
    no error expected, returns a result ``case.check`` accepts."""
    if case.error is None:
        out = case.call(*args)
        assert case.check is not None and case.check(out), f"{case.id}: wrong result {out!r}"
        return
    with pytest.raises(case.error, match=case.match):
        case.call(*args)
