"""save_dir that is a file, a read-only directory, a full disk; unwritable translate outputs.

Tests run as root, which read-only modes do not stop, so the refusals are injected with
monkeypatched ``os`` calls raising the errno the kernel would give."""
import errno
import os
import threading

import pytest
import yaml

from nmt.cli.train import main as train_main
from nmt.cli import translate as translate_cli
from nmt.train.checkpoint import load_checkpoint
from tiny_task import tiny_config, write_task


@pytest.fixture
def config_file(tmp_path):
    def make(**training):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(write_task(tmp_path / "data"), tmp_path / "run",
                                                                    **training)))
        return str(tmp_path / "c.yaml")
    return make


def train(config, capsys, *extra) -> tuple[int, list[str]]:
    code = train_main(["-config", config, "-quiet", *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def test_save_dir_that_is_a_file(tmp_path, config_file, capsys):
    (tmp_path / "run").write_text("not a directory")
    code, err = train(config_file(), capsys)
    assert (code, err) == (2, [f"nmt-train: error: {tmp_path}/run: exists and is not a directory"])
    assert (tmp_path / "run").read_text() == "not a directory"


def test_read_only_save_dir(tmp_path, config_file, capsys, monkeypatch):
    (tmp_path / "run").mkdir()
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "run")) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    code, err = train(config_file(), capsys)
    assert (code, err) == (2, [f"nmt-train: error: {tmp_path}/run/.lock: permission denied"])
    assert os.listdir(tmp_path / "run") == []


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path, config_file, capsys, monkeypatch):
    config = config_file()
    assert train(config, capsys)[0] == 0  # 12 steps; last.pt at step 12
    real_fsync, full = os.fsync, {"on": True}

    def no_space(fd):  # the disk fills while the next checkpoint is written
        if full["on"] and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".last.pt."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_space)
    code, err = train(config, capsys, "-set", "training.max_steps=16")
    assert (code, err) == (2, [f"nmt-train: error: {tmp_path}/run/last.pt: no space left on device"])
    run = tmp_path / "run"
    assert load_checkpoint(run / "last.pt")["step"] == 12
    assert sorted(p.name for p in run.glob(".*")) == []  # no temporary file, the lock released
    full["on"] = False
    assert train(config, capsys, "-set", "training.max_steps=16")[0] == 0  # space again: resumes


def test_translate_output_on_a_full_disk(tmp_path, monkeypatch, capsys):
    from nmt.train.trainer import Trainer
    from nmt.config import resolve_config

    trainer = Trainer(resolve_config(tiny_config(write_task(tmp_path / "data"), tmp_path / "run"), "t.yaml"), "t.yaml")
    trainer.save()
    trainer.lock.release()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    out = tmp_path / "out" / "hyp.txt"
    code = translate_cli.main(["-model", str(tmp_path / "run" / "last.pt"), "-src", str(tmp_path / "data" / "valid.src"),
                               "-output", str(out), "-quiet"])
    assert code == 2 and capsys.readouterr().err == f"nmt-translate: error: {out}: no space left on device\n"
    assert os.listdir(out.parent) == []


def test_a_model_too_large_to_allocate_is_a_one_line_error_naming_the_key(tmp_path, config_file, capsys, monkeypatch):
    """A size within the schema's bounds that this machine cannot allocate (simulated: allocating
    4 * 60000^2 LSTM weights for real would invoke the OOM killer rather than fail)."""
    import nmt.models.builder as builder

    def no_memory(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                           "you tried to allocate 115200000000 bytes.")

    monkeypatch.setattr(builder, "RNNEncoder", no_memory)
    config = config_file()
    code, err = train(config, capsys, "-set", "model.encoder.hidden_size=60000")
    assert code == 2 and err == [f"nmt-train: error: {config}: model.encoder: cannot be allocated with these sizes "
                                 "([enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                                 "you tried to allocate 115200000000 bytes.)"]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_tensorboard_on_a_full_disk_is_one_line_naming_its_directory(tmp_path, config_file, capsys, monkeypatch):
    """TensorBoard's events are written by a background thread: a full disk killed it with a
    traceback on stderr, then failed the run with an error naming no file."""
    from tensorboard.compat.tensorflow_stub.io import gfile

    def no_space(self, filename, file_content, binary_mode=False):  # the file exists; the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)  # what would print a traceback
    monkeypatch.setattr(gfile.LocalFileSystem, "append", no_space)
    code, err = train(config_file(tensorboard=True), capsys)
    assert (code, err) == (2, [f"nmt-train: error: {tmp_path}/run/tensorboard: no space left on device"])
    assert thread_errors == []
    assert sorted(p.name for p in (tmp_path / "run").glob(".*")) == []  # no temporary file, the lock released


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_train_log_on_a_full_disk_is_one_warning_not_a_traceback_per_line(tmp_path, config_file, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").symlink_to("/dev/full")  # every write: ENOSPC
    code, err = train(config_file(), capsys)
    assert code == 0 and len(err) == 1, err  # logging printed a traceback for each record
    assert err[0].endswith(f"WARNING {tmp_path}/run/train.log: no space left on device; "
                           "this log file is not written any more")


def test_a_full_disk_when_taking_the_lock_names_the_lock_file(tmp_path, config_file, capsys, monkeypatch):
    def no_space(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", no_space)
    code, err = train(config_file(), capsys)
    assert (code, err) == (2, [f"nmt-train: error: {tmp_path}/run/.lock: no space left on device"])
