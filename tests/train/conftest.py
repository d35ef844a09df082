"""Fixtures of the trainer tests: the tiny task's files, and a pool of two training ranks."""
import pytest

from tiny_task import write_task


@pytest.fixture
def tiny_task(tmp_path) -> dict:
    """The tiny reversal task written under ``tmp_path / "data"``: its ``train`` / ``valid`` paths."""
    return write_task(tmp_path / "data")


@pytest.fixture(scope="module")
def ranks():
    """A pool of two Gloo training ranks (``ddp_workers.RankPool``), one per test module, closed after it."""
    from ddp_workers import ranks_fixture

    yield from ranks_fixture(2)
