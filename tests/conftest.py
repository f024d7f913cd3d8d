import atexit
import os
import shutil
import tempfile

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
