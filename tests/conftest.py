"""Shared pytest configuration: seeded, single-threaded torch.

The tests run many tiny ops; intra-op threads only add contention there (up to 5-100x slower on a
busy 2-core machine), so every test runs with one torch thread and a fixed seed.
"""
import logging
import sys

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


def _compiled_graphs() -> int:
    """Graphs dynamo has captured in this process (0 before torch._dynamo is imported)."""
    dynamo = sys.modules.get("torch._dynamo")
    return 0 if dynamo is None else dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.fixture(autouse=True)
def _dynamo_caches_per_test():
    """Dynamo's caches emptied after a test that compiled something: its recompile limit (8 graphs
    per code object) is otherwise shared by the whole session, so a function compiled with other
    options by many test files (e.g. the search's ``select_step``) would find it spent and fall back
    to eager mode, or fail under ``fullgraph=True``, depending on which files ran before."""
    before = _compiled_graphs()
    yield
    if _compiled_graphs() != before:
        sys.modules["torch._dynamo"].reset()


@pytest.fixture(autouse=True)
def _nmt_logger_per_test():
    """The ``nmt`` logger as each test found it: a command-line run inside a test (``nmt.cli.*.main``)
    installs handlers on that test's stderr, which pytest's capture closes after the test; a later
    test of the same worker that logs would write to the closed stream ("Logging error" on its own
    stderr) and fail where it reads stderr, depending on which files ran before it."""
    logger = logging.getLogger("nmt")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    # propagating, as in a fresh process, before the test's call phase: pytest >= 9.2 attaches
    # caplog's handler to every non-propagating logger at its start, so a test that turned
    # propagation back on itself would read each record twice
    logger.propagate = True
    yield
    for handler in list(logger.handlers):
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in logger.handlers:
            logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


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


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> str:
    """A tiny copy model trained for a few steps (``a b c`` -> ``abc``; the API and the server are
    tested, not the model's quality): its best.pt."""
    from tiny_runs import tiny_rnn_config, train_run

    root = tmp_path_factory.mktemp("api")
    words = ["a b c", "b c", "c a", "a a b", "c b a", "b"]
    for split in ("train", "valid"):
        (root / f"{split}.src").write_text("".join(w + "\n" for w in words), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(w.replace(" ", "") + "\n" for w in words), encoding="utf-8")
    config = tiny_rnn_config(root, "space", "char", 4, size=8, hidden=8, attention="sparsemax", batch_size=6,
                             valid_batch_size=6, max_length=6)
    train_run(config, root / "config.yaml")
    return str(root / "run" / "best.pt")
