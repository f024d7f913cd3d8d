import pytest
import torch


@pytest.fixture
def generator():
    """A seeded CPU generator; the global RNG state is restored afterwards."""
    state = torch.random.get_rng_state()
    yield torch.Generator().manual_seed(1234)
    torch.random.set_rng_state(state)
