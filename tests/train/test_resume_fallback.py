"""Resume when the newest checkpoint is missing or damaged: the newest one that loads, a warning
per file passed over, one error when none loads, never a silent new run."""
import logging
import os

import pytest
import torch

from nmt.train.checkpoint import (CheckpointError, checkpoint_step, find_resume_checkpoint, load_checkpoint,
                                  resume_candidates)
from tiny_task import make_trainer, write_task


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "data")


@pytest.fixture
def log(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # the CLI's setup_logging turns it off
    caplog.set_level(logging.WARNING, logger="nmt")
    return caplog


def trained(task, run, **training):
    """A finished 12-step run (validations at 4, 8, 12; keep_last 2: step_8.pt, step_12.pt)."""
    make_trainer(task, run, **training).train()
    return run


def replace_with(path, data: bytes):
    """Write new bytes under the name only (a new inode: the hard links of the same save keep theirs)."""
    path.unlink()
    path.write_bytes(data)


def truncate(path, keep: float = 0.5):
    replace_with(path, path.read_bytes()[: int(path.stat().st_size * keep)])


def test_a_truncated_last_pt_resumes_from_the_newest_step_checkpoint(task, tmp_path, log):
    # on the CPU wherever CUDA is (device cpu below): the resumed run is compared bit for bit with an
    # uninterrupted one, which needs deterministic kernels (not cuDNN's LSTM backward, CUDA atomics)
    run = trained(task, tmp_path / "run", max_steps=10, device="cpu")  # validations at 4, 8; step 10 by the final one
    assert checkpoint_step(run / "step_10.pt") == 10
    # cut in place: the same save's step_10.pt (and best.pt, step 10 being the best) are hard links
    # of last.pt where the filesystem allows, so they are damaged too; older files are not
    os.truncate(run / "last.pt", (run / "last.pt").stat().st_size // 2)
    for name in ("step_10.pt", "best.pt"):
        if checkpoint_step(run / name) == 10:  # (no hard links here: damage the copy as well)
            truncate(run / name)
    resumed = make_trainer(task, run, max_steps=12, device="cpu")
    assert resumed.resumed and resumed.progress.step == 8 and resumed.resume_path == run / "step_8.pt"
    warnings = [r.getMessage() for r in log.records if r.levelno == logging.WARNING]
    assert any(w.startswith(f"{run}/last.pt: not a readable nmt checkpoint (not a torch.save archive")
               and w.endswith(f"; resuming from {run}/step_8.pt (step 8) instead") for w in warnings), warnings
    assert any(w.startswith(f"{run}/step_10.pt: not a readable") for w in warnings), warnings
    assert all("\n" not in w for w in warnings)
    assert load_checkpoint(run / "last.pt")["step"] == 8  # the run directory is whole again
    assert checkpoint_step(run / "best.pt") == 8  # the best the resumed state records
    # continuing from step 8 gives the state of an uninterrupted run (same RNG and data position)
    assert resumed.train().step == 12
    straight = trained(task, tmp_path / "straight", device="cpu")
    a, b = load_checkpoint(straight / "last.pt")["model"], load_checkpoint(run / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_missing_last_pt_with_step_checkpoints_resumes_instead_of_starting_over(task, tmp_path, log):
    run = trained(task, tmp_path / "run")
    (run / "last.pt").unlink()
    resumed = make_trainer(task, run, max_steps=16)
    assert resumed.progress.step == 12 and resumed.resume_path == run / "step_12.pt"
    assert f"{run}/last.pt: missing; resuming from {run}/step_12.pt (step 12) instead" in log.text


def test_a_checkpoint_missing_payload_keys_is_passed_over(task, tmp_path, log):
    run = trained(task, tmp_path / "run")
    payload = load_checkpoint(run / "last.pt")
    del payload["optimizer"]
    (run / "last.pt").unlink()
    torch.save(payload, run / "last.pt")
    assert make_trainer(task, run, max_steps=16).progress.step == 12  # step_12.pt: the same state
    assert f"{run}/last.pt: incomplete checkpoint, missing optimizer; resuming from {run}/step_12.pt" in log.text


def test_best_pt_serves_when_it_is_the_newest_loadable_checkpoint(task, tmp_path, log):
    run = trained(task, tmp_path / "run", keep_last=0)  # last.pt and best.pt only
    best_step = checkpoint_step(run / "best.pt")
    truncate(run / "last.pt", keep=0.9)
    assert resume_candidates(run) == [run / "last.pt", run / "best.pt"]
    resumed = make_trainer(task, run, keep_last=0, max_steps=16)
    assert resumed.progress.step == best_step and resumed.resume_path == run / "best.pt"


def test_candidates_place_best_pt_by_the_step_it_holds(task, tmp_path):
    run = trained(task, tmp_path / "run", keep_last=3)  # step_4, step_8, step_12
    best = checkpoint_step(run / "best.pt")
    names = [p.name for p in resume_candidates(run)]
    steps = (12, 8, 4)
    assert names == (["last.pt"] + [f"step_{n}.pt" for n in steps if n >= best] + ["best.pt"]
                     + [f"step_{n}.pt" for n in steps if n < best])  # after its own copy, before older files
    (run / "best.pt").write_bytes(b"garbage")  # unreadable step: last resort
    assert resume_candidates(run)[-1].name == "best.pt"


def test_when_no_checkpoint_loads_the_error_names_every_file(task, tmp_path):
    run = trained(task, tmp_path / "run")
    for name in ("last.pt", "best.pt", "step_8.pt", "step_12.pt"):
        replace_with(run / name, b"half a file")
    with pytest.raises(CheckpointError) as info:
        make_trainer(task, run)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{run}: no checkpoint there can be resumed from (last.pt: not a")
    for name in ("last.pt", "step_12.pt", "step_8.pt", "best.pt"):
        assert f"{name}: not a readable nmt checkpoint" in text
    assert (run / "last.pt").read_bytes() == b"half a file"  # nothing overwritten, no new run started


def test_a_refused_newest_checkpoint_is_not_passed_over(task, tmp_path):
    """Another format version is not damage: falling back to an older checkpoint would drop its state."""
    run = trained(task, tmp_path / "run")
    payload = load_checkpoint(run / "last.pt")
    payload["format_version"] = 99
    (run / "last.pt").unlink()
    torch.save(payload, run / "last.pt")
    with pytest.raises(CheckpointError, match=r"last.pt: checkpoint format version 99 .* is not supported"):
        make_trainer(task, run)


def test_no_checkpoint_at_all_is_a_new_run(task, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")  # an attempt killed before its first checkpoint
    assert find_resume_checkpoint(run) is None
    assert not make_trainer(task, run).resumed


def test_a_damaged_best_pt_is_repaired_from_the_checkpoint_that_holds_the_best(task, tmp_path, log):
    run = trained(task, tmp_path / "run", keep_last=3)
    best = checkpoint_step(run / "best.pt")
    replace_with(run / "best.pt", b"")
    make_trainer(task, run, keep_last=3, max_steps=16)
    assert checkpoint_step(run / "best.pt") == best
    assert f"best.pt repaired: it now holds step {best}" in log.text


def test_a_read_error_is_not_damage_and_stops_the_search(tmp_path, monkeypatch):
    """An I/O error (EIO on a network filesystem) or no memory while reading last.pt says nothing
    about the file: a resume must not pass over it to an older checkpoint (which then replaces
    last.pt, the newest state lost); it is a plain CheckpointError naming the file."""
    import errno

    from nmt.utils import checkpoint_file
    from nmt.utils.checkpoint_file import FORMAT_VERSION, PAYLOAD_KEYS, DamagedCheckpointError

    payload = {key: {} for key in PAYLOAD_KEYS}
    payload.update(format_version=FORMAT_VERSION, nmt_version="x", step=4)
    for name in ("last.pt", "step_4.pt"):
        torch.save(payload, tmp_path / name)
    real_load = torch.load

    def flaky(path, *args, **kwargs):
        if os.path.basename(path) == "last.pt":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_file.torch, "load", flaky)
    with pytest.raises(CheckpointError) as caught:
        find_resume_checkpoint(tmp_path)
    assert not isinstance(caught.value, DamagedCheckpointError)
    assert str(caught.value) == f"{tmp_path / 'last.pt'}: cannot be read ({os.strerror(errno.EIO)})"


def test_a_damaged_best_pt_that_cannot_be_repaired_is_said(task, tmp_path, log):
    """best.pt damaged while the step file of the best the resumed checkpoint records was rotated
    away: nothing can restore it, and the resume says so (it went on silently, best.pt unreadable
    until a better validation, or for good)."""
    from nmt.train.checkpoint import save_checkpoint

    run = trained(task, tmp_path / "run", keep_last=2)  # step_8.pt, step_12.pt
    last = load_checkpoint(run / "last.pt")
    last["trainer"]["early_stopping"]["best_step"] = 4  # the best at step 4, whose step file is gone
    save_checkpoint(run / "last.pt", last)
    replace_with(run / "best.pt", b"")
    make_trainer(task, run, keep_last=2, max_steps=16)
    assert f"{run / 'best.pt'}: does not hold step 4, the best last.pt records (damaged or missing)" in log.text


def flip_a_weight_bit(path) -> bytes:
    """Flip one bit inside the tensor data of ``path`` (a new inode, as ``replace_with``); returns the bytes."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:  # Python's own zip reader finds the first tensor record
        info = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size >= 16)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0x08
    replace_with(path, bytes(data))
    return bytes(data)


def test_damaged_newer_checkpoints_are_moved_aside_and_leave_the_rotation_alone(task, tmp_path, log):
    """last.pt truncated and step_12.pt with a flipped bit: the resume from step_8.pt renames both
    to NAME.damaged (same bytes, a warning naming each). Left in place, the damaged step_12.pt would
    count among the newest two of keep_last: 2 when the run then stops at step 10, and the good
    step_8.pt would be deleted in its place."""
    run = trained(task, tmp_path / "run", device="cpu")  # step_8.pt, step_12.pt; last.pt and best.pt of step 12
    truncate(run / "last.pt")
    last_bytes = (run / "last.pt").read_bytes()
    step_12_bytes = flip_a_weight_bit(run / "step_12.pt")
    if checkpoint_step(run / "best.pt") == 12:
        flip_a_weight_bit(run / "best.pt")
    resumed = make_trainer(task, run, max_steps=10, device="cpu")
    assert resumed.resume_path == run / "step_8.pt" and resumed.progress.step == 8
    assert (run / "last.pt.damaged").read_bytes() == last_bytes
    assert (run / "step_12.pt.damaged").read_bytes() == step_12_bytes and not (run / "step_12.pt").exists()
    assert f"{run}/step_12.pt: damaged: record " in log.text  # why it was passed over
    assert f"{run}/step_12.pt: moved aside to step_12.pt.damaged (damaged)" in log.text
    assert f"{run}/last.pt: moved aside to last.pt.damaged (damaged)" in log.text
    resumed.train()
    assert sorted(p.name for p in run.glob("step_*.pt")) == ["step_10.pt", "step_8.pt"]
    assert [load_checkpoint(run / f"step_{n}.pt")["step"] for n in (8, 10)] == [8, 10]
    assert load_checkpoint(run / "best.pt")["step"] == resumed.stopper.best_step


def test_a_bit_flipped_best_pt_not_visited_by_the_resume_is_moved_aside_and_repaired(task, tmp_path, log):
    """best.pt (step 12, as last.pt) with a flipped bit: the resume from the intact last.pt never
    loads it, and its step still reads as 12; its CRC-32 check finds it, it is set aside and
    restored from last.pt."""
    run = trained(task, tmp_path / "run")
    assert checkpoint_step(run / "best.pt") == 12 == load_checkpoint(run / "last.pt")["step"]
    flipped = flip_a_weight_bit(run / "best.pt")
    assert checkpoint_step(run / "best.pt") == 12  # the lazy step read does not see it
    make_trainer(task, run, max_steps=16)
    assert (run / "best.pt.damaged").read_bytes() == flipped
    assert (run / "best.pt").read_bytes() == (run / "last.pt").read_bytes()
    assert f"{run}/best.pt: record " in log.text and "moved aside to best.pt.damaged (damaged)" in log.text


def test_set_aside_never_overwrites(tmp_path):
    from nmt.train.checkpoint import set_aside_damaged

    for content in (b"first", b"second", b"third"):
        (tmp_path / "last.pt").write_bytes(content)
        set_aside_damaged(tmp_path / "last.pt")
    assert [(tmp_path / n).read_bytes() for n in ("last.pt.damaged", "last.pt.damaged.2", "last.pt.damaged.3")] == [
        b"first", b"second", b"third"]
    assert not (tmp_path / "last.pt").exists()


def count_crc_passes(monkeypatch) -> list[str]:
    """Record the file name of every CRC-32 pass (the resume's load and the checks of best.pt)."""
    from nmt.train import checkpoint
    from nmt.utils import checkpoint_file, zip_crc

    passes: list[str] = []

    def counted(path):
        passes.append(os.path.basename(path))
        return zip_crc.zip_crc_problem(path)

    monkeypatch.setattr(checkpoint, "zip_crc_problem", counted)
    monkeypatch.setattr(checkpoint_file, "zip_crc_problem", counted)
    return passes


@pytest.mark.parametrize("best_pt", ["copy of the best", "older best", "hard link of last.pt"])
def test_a_resume_reads_best_pt_once(task, tmp_path, log, monkeypatch, best_pt):
    """best.pt's CRC-32 is computed at most once per resume (it was three times: the damage check,
    repair_best's and the missing-best warning's holds_step): once where it is a file of its own
    (intact, of the recorded best step: nothing to say; of an older step, as after a crash between
    writing last.pt and best.pt: repaired from last.pt), never where it is the file the resume
    loaded (a hard link of last.pt: its bytes passed that load's check)."""
    run = trained(task, tmp_path / "run")
    assert checkpoint_step(run / "best.pt") == 12 == load_checkpoint(run / "last.pt")["step"]
    if best_pt == "copy of the best":
        replace_with(run / "best.pt", (run / "best.pt").read_bytes())
    elif best_pt == "older best":
        replace_with(run / "best.pt", (run / "step_8.pt").read_bytes())
    else:
        (run / "best.pt").unlink()
        try:
            os.link(run / "last.pt", run / "best.pt")
        except OSError:
            pytest.skip("no hard links on this filesystem")
    passes = count_crc_passes(monkeypatch)
    make_trainer(task, run, max_steps=16)
    assert passes.count("last.pt") == 1  # the resume's load
    assert passes.count("best.pt") == (0 if best_pt == "hard link of last.pt" else 1)
    assert checkpoint_step(run / "best.pt") == 12
    repaired = [r.getMessage() for r in log.records if r.getMessage().startswith("best.pt repaired")]
    assert repaired == (["best.pt repaired: it now holds step 12, the best last.pt records (from last.pt; a save "
                         "was interrupted or best.pt was damaged)"] if best_pt == "older best" else [])
    assert "does not hold step" not in log.text and "moved aside" not in log.text
