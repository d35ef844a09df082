import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_threads():
    """The benchmarks set torch's thread count (2, the peer setting): restore the suite's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
