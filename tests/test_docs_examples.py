"""The ``python`` blocks of ``docs/*.md`` are part of the test suite, as the README's are
(``tests/test_readme.py``): every ``>>>`` session runs as shown, and every other ``python``
block runs.

A block is marked by HTML comments (invisible on the rendered page) written in the prose
between the previous fence and the block's opening fence::

    <!-- doctest: skip: REASON -->
        The block is not run; REASON (required) is the skip reason shown by pytest: it
        needs CUDA, an optional package, or minutes of compilation.
    <!-- doctest: setup
    CODE
    -->
        CODE runs first, in the block's namespace: the names a fragment takes from the
        page around it (``model``, ``loader``, ``criterion`` ...), kept small.
    <!-- doctest: setup NAME -->
        The same with ``SETUPS[NAME]`` of this file, for a context several pages share
        (``autoencoder``: the main example's model, a CSR loader, a criterion, an optimiser).
    <!-- doctest: replace OLD => NEW -->
        OLD (which must occur in the block) becomes NEW before the block runs: only to make
        a run shorter (a fit of a minute becomes two epochs) or to pick a faster path.

Several setups run in their order.  The sessions (blocks holding ``>>>``) of one page
share one namespace, in the page's order, as a reader typing them in one interpreter would;
a plain block runs alone, in a fresh namespace.  Every block runs in a temporary working directory (blocks write files) and
leaves torch's random state as it found it.  Blocks are kept under about 2 s each: a longer
one is shortened with ``replace`` or skipped with its reason.
"""
import doctest
import re
import textwrap
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest
import torch

DOCS = Path(__file__).resolve().parents[1] / "docs"
# a fence may be indented (a block inside a list item): its lines are dedented
_FENCE = re.compile(r"^([ \t]*)```(\S*)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*doctest:\s*(.*?)-->", re.S)


SETUPS = {
    # the main example's autoencoder, as the pages' fragments name it
    "autoencoder": """
import torch, nnsparse
from torch import nn
from torch.utils.data import DataLoader
from nnsparse.data import SparseRowDataset

width, hidden = n, h = 12, 4


class Autoencoder(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x, pattern=None):
        h = torch.tanh(self.encoder(x))
        return nnsparse.values_map(torch.tanh, self.decoder(h, pattern))


torch.manual_seed(0)
ratings = torch.rand(10, width) * (torch.rand(10, width) < 0.4)
dataset = SparseRowDataset(ratings.to_sparse_csr())
loader = DataLoader(dataset, batch_size=4, collate_fn=dataset.collate)
x = next(iter(loader)).input
model = Autoencoder(width, hidden)
criterion = nnsparse.SparseCriterion(nn.MSELoss())
optimiser = torch.optim.Adam(model.parameters())
""",
}


class Block(NamedTuple):
    page: str
    line: int  # of the opening fence, 1-based
    source: str
    skip: Optional[str]
    setup: str
    replace: Tuple[Tuple[str, str], ...]

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def is_session(self) -> bool:
        return ">>>" in self.source

    def code(self) -> str:
        source = self.source
        for old, new in self.replace:
            assert old in source, f"{self.name}: replace marker's {old!r} is not in the block"
            source = source.replace(old, new)
        return source


def _markers(prose: str, where: str) -> Tuple[Optional[str], str, List[Tuple[str, str]]]:
    skip, setup, replace = None, "", []
    for body in _MARKER.findall(prose):
        body = body.strip()
        if body.startswith("skip:") and body[5:].strip():
            skip = body[5:].strip()
        elif body.startswith("setup\n"):
            setup += body[6:] + "\n"
        elif body.startswith("setup ") and body[6:].strip() in SETUPS:
            setup += SETUPS[body[6:].strip()]
        elif body.startswith("replace ") and " => " in body:
            old, new = body[8:].split(" => ", 1)
            replace.append((old.strip(), new.strip()))
        else:
            raise ValueError(f"{where}: unknown doctest marker {body!r}; expected 'skip: "
                             f"REASON', 'setup' + code, 'setup NAME' (NAME in {sorted(SETUPS)}) "
                             "or 'replace OLD => NEW'")
    return skip, setup, replace


def _blocks() -> List[Block]:
    blocks = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        end = 0
        for match in _FENCE.finditer(text):
            prose, end = text[end:match.start()], match.end()
            line = text.count("\n", 0, match.start()) + 1
            skip, setup, replace = _markers(prose, f"{path.name}:{line}")
            if match.group(2) != "python":
                assert not (skip or setup or replace), \
                    f"{path.name}:{line}: doctest marker before a non-python block"
                continue
            source = textwrap.dedent(match.group(3))
            blocks.append(Block(path.name, line, source, skip, setup, tuple(replace)))
    return blocks


BLOCKS = _blocks()
SESSION_PAGES = sorted({b.page for b in BLOCKS if b.is_session})
PLAIN = [b for b in BLOCKS if not b.is_session]


def _param(block: Block):
    marks = [pytest.mark.skip(reason=block.skip)] if block.skip else []
    return pytest.param(block, id=block.name, marks=marks)


@pytest.fixture
def _scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = torch.random.get_rng_state()
    threads = torch.get_num_threads()
    yield
    torch.random.set_rng_state(state)
    torch.set_num_threads(threads)


def test_docs_have_examples():
    assert SESSION_PAGES and PLAIN, "docs/*.md lost their python examples; drop this test"


def test_no_session_outside_python_blocks():
    # a ``>>>`` line outside a ``python`` fence would never run
    for path in sorted(DOCS.glob("*.md")):
        text = _FENCE.sub(lambda m: "" if m.group(2) == "python" else m.group(0),
                          path.read_text())
        assert not re.search(r"^\s*>>> ", text, re.M), f"{path.name}: >>> outside ```python"


@pytest.mark.parametrize("page", SESSION_PAGES)
def test_docs_sessions_run(page, _scratch):
    """Every ``>>>`` line of the page's sessions runs as shown (one namespace per page)."""
    globs: Dict[str, object] = {"__name__": f"docs.{page}"}
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE
                                   | doctest.ELLIPSIS)
    parser = doctest.DocTestParser()
    ran = 0
    for block in (b for b in BLOCKS if b.page == page and b.is_session):
        if block.skip:
            continue
        if block.setup:
            exec(compile(block.setup, f"{block.name} setup", "exec"), globs)
        test = parser.get_doctest(block.code(), globs, block.name, str(DOCS / page),
                                  block.line)
        runner.run(test, clear_globs=False)
        globs = test.globs  # a DocTest runs in a copy of the namespace it is given
        ran += len(test.examples)
    result = runner.summarize(verbose=False)
    assert ran > 0
    assert result.failed == 0, f"{page}: {result.failed} of {result.attempted} examples failed"


@pytest.mark.parametrize("block", [_param(b) for b in PLAIN])
def test_docs_plain_blocks_run(block, _scratch, capsys):
    namespace: Dict[str, object] = {"__name__": f"docs.{block.page}"}
    if block.setup:
        exec(compile(block.setup, f"{block.name} setup", "exec"), namespace)
    exec(compile(block.code(), block.name, "exec"), namespace)
    printed = capsys.readouterr().out
    # a comment that shows a printed dict names its keys: the code must print them
    for comment in re.findall(r"print\(.*#\s*(\{.*\})", block.source):
        for key in re.findall(r"'(\w+)'", comment):
            assert f"'{key}'" in printed, (block.name, key, printed[-300:])


def test_markers_are_read():
    # the convention above, on a page of its own: a skip, a setup and a replace
    page = ("text\n<!-- doctest: skip: needs CUDA -->\n```python\nx\n```\n"
            "<!-- doctest: setup\ny = 1\n-->\n<!-- doctest: replace a() => b() -->\n"
            "```python\na()\n```\n")
    skip, setup, replace = _markers(page.split("```python")[1], "page")
    assert (skip, setup, replace) == (None, "y = 1\n", [("a()", "b()")])
    assert _markers("<!-- doctest: setup autoencoder -->", "page")[1] == SETUPS["autoencoder"]
    assert _markers(page.split("```python")[0], "page")[0] == "needs CUDA"
    with pytest.raises(ValueError, match="unknown doctest marker 'skip:'"):
        _markers("<!-- doctest: skip: -->", "page")
    with pytest.raises(ValueError, match="unknown doctest marker 'setup nowhere'"):
        _markers("<!-- doctest: setup nowhere -->", "page")
