"""Fixtures of the trainer tests."""
import pytest

from tiny_task import write_task


@pytest.fixture
def tiny_task(tmp_path) -> dict:
    """The tiny reversal task written under ``tmp_path / "data"``: its ``train`` / ``valid`` paths."""
    return write_task(tmp_path / "data")
