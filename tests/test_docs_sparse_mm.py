"""docs/sparse_mm.md (README text) runs as shown: every ``>>>`` line is a doctest."""
import doctest
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "sparse_mm.md"


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_sparse_mm_doc_examples_run():
    result = doctest.testfile(str(DOC), module_relative=False,
                              optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted >= 10
    assert result.failed == 0
