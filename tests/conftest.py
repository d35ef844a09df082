"""Shared pytest configuration: seeded, single-threaded torch.

The tests run many tiny ops; intra-op threads only add contention there (up to 5-100x slower on a
busy 2-core machine), so every test runs with one torch thread and a fixed seed.
"""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Mark ``cuda`` every test skipped without CUDA ("needs CUDA"), besides those marked by hand
    (tests whose CUDA path runs only where CUDA is): ``pytest -m cuda`` runs them first on a GPU
    machine (``tools/gpu_check.sh tests_cuda``)."""
    for item in items:
        if any(mark.kwargs.get("reason") == "needs CUDA" for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def count_calls(monkeypatch):
    """``count_calls(owner, name) -> list``: replaces ``owner.name`` (a module's function or a
    class's method) by a wrapper that appends to the returned list at every call, then calls the
    original; undone after the test."""
    def patch(owner, name: str) -> list:
        calls: list = []
        original = getattr(owner, name)

        def counting(*args, **kwargs):
            calls.append(True)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)
        return calls

    return patch
