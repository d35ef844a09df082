"""Shared pytest configuration: seeded, single-threaded torch.

The tests run many tiny ops; intra-op threads only add contention there (up to 5-100x slower on a
busy 2-core machine), so every test runs with one torch thread and a fixed seed.
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
