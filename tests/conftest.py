import atexit
import contextlib
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

# One hypothesis profile for every property test: deterministic (derandomized: the same
# examples at each run), no example database, no deadline (a busy machine is no failure).
# A test sets its own max_examples only.  To hunt for new failures, raise max_examples and
# drop derandomize locally.
settings.register_profile(
    "nnsparse", database=None, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("nnsparse")

# Without a database hypothesis still writes caches (the constants of local source files,
# the unicode charmap) under .hypothesis/ in the working directory: a temporary directory
# instead, removed at exit, unless HYPOTHESIS_STORAGE_DIRECTORY names one.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    _HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="nnsparse-hypothesis-")
    atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, ignore_errors=True)
    set_hypothesis_home_dir(_HYPOTHESIS_HOME)


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inside(path, folder):
    return os.path.commonpath([os.path.abspath(path or os.curdir), folder]) == folder


# The running environment's library folders (a virtual environment made inside the clone,
# as CI does, has them inside _ROOT); not sys.prefix itself, which may hold the clone
# (a conda or container prefix), and would then have hidden every folder of it.
_LIBS = sorted({os.path.abspath(p) for k, p in sysconfig.get_paths().items()
                if k in ("stdlib", "platstdlib", "purelib", "platlib")}
               | {os.path.abspath(p) for p in getattr(site, "getsitepackages", list)()})
_LIBS = [lib for lib in _LIBS if not _inside(_ROOT, lib)]


def _ours(paths):
    """The entries of ``paths`` that are folders of this repository (benchmarks/, examples/,
    tests/ ...), in order, repeats kept.  Not the running environment's library folders
    (a virtual environment made inside the clone, as CI does): a library may add its own
    folder once, at its first import (setuptools' vendored packages, which torch.compile
    imports), and needs it kept."""
    return [p for p in paths
            if _inside(p, _ROOT) and not any(_inside(p, lib) for lib in _LIBS)]


@pytest.fixture(autouse=True)
def _sys_path_as_it_was():
    """Every test leaves this repository's folders on ``sys.path`` as it found them: an
    entry one test added made the next import its modules, so a test passed in the suite
    and failed alone.  The benchmarks' folder is on the path for the whole run
    (``pythonpath`` in setup.cfg's ``[tool:pytest]``); a test that needs another uses
    ``monkeypatch.syspath_prepend``.  Repeats count: the benchmarks' folder inserted again,
    as 12 tests did, is one added.  (A list comparison per test; the folders are looked at
    only when ``sys.path`` changed.)"""
    before = list(sys.path)
    yield
    if sys.path == before:
        return
    was, got = Counter(_ours(before)), Counter(_ours(sys.path))
    added, removed = list((got - was).elements()), list((was - got).elements())
    if added or removed:
        sys.path[:] = before + [p for p in sys.path if p not in before and p not in added]
        pytest.fail(f"sys.path must be left as it was, got {added} added and {removed} "
                    f"removed (use monkeypatch.syspath_prepend, or setup.cfg's pythonpath)")


@pytest.fixture
def generator():
    """A seeded CPU generator; the global RNG state is restored afterwards."""
    state = torch.random.get_rng_state()
    yield torch.Generator().manual_seed(1234)
    torch.random.set_rng_state(state)


@pytest.fixture
def group_of_one():
    """A gloo process group of one process: DistributedDataParallel and the checks that
    need a group run in this one process."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# The CPU proxy of torch.cuda.set_sync_debug_mode("error"): every Python-level read of a
# tensor to the host.  (tests/test_optim_backward.py counts aten::item in the profiler;
# tolist makes none, hence these patches.)
_HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


def _refuse(name, original):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} called")
    return refuse


@pytest.fixture
def host_reads(monkeypatch):
    """A context manager: ``with host_reads():`` every Python-level read of a tensor to the
    host (``Tensor.item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``,
    ``__index__``) raises an ``AssertionError`` naming it; with ``nonzero=True``
    ``Tensor.nonzero`` and ``torch.nonzero`` too.  ``host_reads(replace)`` puts
    ``replace(name, original)`` in each one's place instead (a spy that calls ``original``).
    Everything is restored on leaving the block."""
    @contextlib.contextmanager
    def patched(replace=_refuse, nonzero=False):
        with monkeypatch.context() as m:
            for name in _HOST_READS + (("nonzero",) if nonzero else ()):
                m.setattr(torch.Tensor, name, replace(name, getattr(torch.Tensor, name)))
            if nonzero:
                m.setattr(torch, "nonzero", replace("nonzero", torch.nonzero))
            yield
    return patched


@pytest.fixture
def default_dtype():
    """A context manager: ``with default_dtype(torch.float64):`` runs the block with torch's
    default dtype set to it, and restores the one before on leaving (also after an error)."""
    @contextlib.contextmanager
    def set_to(dtype):
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(before)
    return set_to


@pytest.fixture
def same_draws_under(default_dtype):
    """``check(prepare, default, sparse)``: ``prepare`` (a fresh seeded criterion's
    ``prepare_input``) corrupts a fixed 40 x 50 batch (COO when ``sparse``) to the same
    entries under torch's default dtype ``default`` as under float32 (the draws were made
    in the default dtype: another corruption for a seed, probe 18)."""
    def check(prepare, default, sparse):
        x = torch.rand(40, 50, generator=torch.Generator().manual_seed(0)) + 1.0
        given = x.to_sparse() if sparse else x

        def run():
            out = prepare(given)
            return out if out.layout == torch.strided else out.to_dense()

        expected = run()
        with default_dtype(default):
            got = run()
        assert torch.equal(got, expected)
    return check
