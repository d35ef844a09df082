"""The run directory under faults: a crash between checkpoint writes, kill -9 during a save,
two runs on one save_dir, and config.yaml describing the weights."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import nmt.train.checkpoint as checkpoint_module
from nmt.cli.train import main as train_main
from nmt.train.checkpoint import checkpoint_step, load_checkpoint
from nmt.train.trainer import Trainer
from nmt.config import resolve_config
from nmt.utils.dir_lock import DirectoryLock, DirectoryLockedError
from tiny_task import make_trainer, tiny_config, write_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "data")


class Crash(Exception):
    pass


def test_crash_between_last_and_best_is_repaired_on_resume(task, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_copy = checkpoint_module._atomic_copy

    def crash_before_best(source, target):
        if target.name == "best.pt" and checkpoint_step(source) == 8:
            raise Crash("power cut between last.pt and best.pt")
        real_copy(source, target)

    monkeypatch.setattr(checkpoint_module, "_atomic_copy", crash_before_best)
    with pytest.raises(Crash):
        make_trainer(task, run).train()
    last = load_checkpoint(run / "last.pt")
    assert last["step"] == 8 and last["trainer"]["early_stopping"]["best_step"] == 8  # step 8 was a new best
    assert checkpoint_step(run / "best.pt") == 4  # the inconsistent pair the crash left
    monkeypatch.setattr(checkpoint_module, "_atomic_copy", real_copy)
    resumed = make_trainer(task, run)  # the lock was released by the crashed train()
    assert checkpoint_step(run / "best.pt") == 8
    summary = resumed.train()
    assert checkpoint_step(run / "best.pt") == summary.best_step


def test_kill_9_during_a_save_leaves_nothing_that_survives_the_next_start(task, tmp_path):
    run = tmp_path / "run"
    config = resolve_config(tiny_config(task, run, max_steps=4, valid_every=2), "tiny.yaml")
    script = textwrap.dedent(f"""
        import os, signal, torch
        from nmt.train.trainer import Trainer
        real_save = torch.save
        def dying_save(obj, handle, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("step") == 4:
                handle.write(b"half a checkpoint"); handle.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            real_save(obj, handle, *args, **kwargs)
        torch.save = dying_save
        Trainer({config!r}, "tiny.yaml").train()
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    leftovers = sorted(p.name for p in run.glob(".*"))
    assert ".lock" in leftovers and any(n.startswith(".last.pt.") and n.endswith(".tmp") for n in leftovers)
    assert load_checkpoint(run / "last.pt")["step"] == 2  # the old file is intact
    trainer = make_trainer(task, run, max_steps=4, valid_every=2)  # takes over the dead run's lock, removes its temp file
    assert [p.name for p in run.glob(".*.tmp")] == []
    assert trainer.progress.step == 2 and trainer.train().step == 4


def test_the_start_removes_dead_writers_temporaries_only(task, tmp_path):
    """Under the lock the temporaries of the run's own files are stale whoever left them; those of
    other outputs written into save_dir (nmt-average, nmt-translate) only when their writer is gone."""
    from nmt.utils.io import _host_tag

    run = tmp_path / "run"
    run.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = _host_tag()
    try:
        removed = [".last.pt.k2j3h4g5.tmp", ".best.pt.link.tmp", f".step_4.pt.p{live.pid}h{tag}.abcdefgh.tmp",
                   f".avg.pt.p{dead.pid}h{tag}.abcdefgh.tmp"]
        kept = [f".avg.pt.p{live.pid}h{tag}.abcdefgh.tmp", ".out.txt.k2j3h4g5.tmp",
                f".out.txt.p{dead.pid}h{_host_tag('another-host')}.abcdefgh.tmp"]
        for name in removed + kept:
            (run / name).write_bytes(b"partial")
        make_trainer(task, run)
        assert sorted(p.name for p in run.glob(".*.tmp")) == sorted(kept)
    finally:
        live.kill()
        live.wait()


def test_a_refused_second_run_removes_nothing(task, tmp_path):
    """The lock comes first: a run refused on a locked save_dir never touches the owner's temporaries."""
    first = make_trainer(task, tmp_path / "run")
    in_progress = tmp_path / "run" / ".last.pt.abcdefgh.tmp"  # as the owner's save would hold it
    in_progress.write_bytes(b"being written")
    with pytest.raises(DirectoryLockedError):
        make_trainer(task, tmp_path / "run")
    assert train_main(["-config", str(_write_config(task, tmp_path)), "-quiet"]) == 2
    assert in_progress.read_bytes() == b"being written"
    first.lock.release()


def _write_config(task, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config(task, tmp_path / "run")), encoding="utf-8")
    return path


def test_a_second_run_on_the_same_save_dir_is_refused(task, tmp_path):
    first = make_trainer(task, tmp_path / "run")
    with pytest.raises(DirectoryLockedError, match=rf"^{tmp_path}/run/.lock: {tmp_path}/run is in use by another "
                                                   rf"nmt-train run \(pid {os.getpid()} on {socket.gethostname()}\)"):
        make_trainer(task, tmp_path / "run")
    first.train()  # unaffected; the lock is released at the end
    assert not (tmp_path / "run" / ".lock").exists()
    make_trainer(task, tmp_path / "run", max_steps=14).train()


def test_cli_refuses_a_save_dir_locked_by_another_process(task, tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from nmt.utils.dir_lock import DirectoryLock; "
         f"lock = DirectoryLock({str(run)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(task, run)))
        assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"nmt-train: error: {run}/.lock: {run} is in use by another nmt-train run "
                       f"(pid {holder.pid} on {socket.gethostname()}); wait for it to end or use another directory"]
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 0  # the dead holder's lock is stale


def test_stale_lock_file_of_a_dead_pid_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(f"{dead.stdout.strip()} {socket.gethostname()}\n")
    with DirectoryLock(tmp_path) as lock:
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()} {socket.gethostname()}\n" and lock.held


def test_finished_run_rerun_with_a_changed_value_keeps_config_yaml(task, tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(task, tmp_path / "run")))
    config_yaml = tmp_path / "run" / "config.yaml"
    assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 0
    before = config_yaml.read_text()
    # finished at step 12: a smaller max_steps takes no step, so the weights are still those of max_steps 12
    assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet", "-set", "training.max_steps=10"]) == 0
    assert config_yaml.read_text() == before
    # a longer run takes steps with the new value: config.yaml follows the weights
    assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet", "-set", "training.max_steps=14"]) == 0
    assert yaml.safe_load(config_yaml.read_text())["training"]["max_steps"] == 14


def test_a_filesystem_without_flock_falls_back_to_the_recorded_pid(tmp_path, monkeypatch):
    """Lustre mounted noflock (and some FUSE / SMB mounts) refuse flock with ENOSYS / ENOLCK /
    EOPNOTSUPP: nmt-train could not start at all there ("[Errno 38] Function not implemented")."""
    import errno

    import nmt.utils.dir_lock as dir_lock

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(dir_lock.fcntl, "flock", no_flock)
    with DirectoryLock(tmp_path / "run", "nmt-train run") as lock:
        assert lock.held and (tmp_path / "run" / ".lock").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        with pytest.raises(DirectoryLockedError, match=rf"\(pid {os.getpid()} on "):  # a live owner
            DirectoryLock(tmp_path / "run", "nmt-train run").acquire()
    assert not (tmp_path / "run").exists()  # released: lock file and created directory removed
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(f"{dead.stdout.strip()} {socket.gethostname()}\n")  # left by a kill -9
    with DirectoryLock(tmp_path) as lock:
        assert lock.held
