"""Per-rank hooks for :class:`ddp_workers.RankPool` jobs (module-level classes: they pickle into
the spawned ranks): a record of the files each rank writes, snapshots of the state each rank
starts from, injected fp16 overflows, and what each rank holds at the end.

The write record is a Python audit hook (``sys.addaudithook``): every ``open`` for writing
(``open``, ``os.open``, ``tempfile.mkstemp``, ``np.save``), rename, link, removal, directory
creation or removal, truncation and mode change of a path under a watched root. Writes made by
C++ code on its own (not through a Python file object) would not be seen; nmt's writers all go
through Python file objects (``torch.save`` into an ``atomic_open`` handle).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import asdict

import torch

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.link", "os.symlink", "os.truncate",
            "os.chmod", "shutil.rmtree", "shutil.move", "os.utime"}
_watch: dict = {"root": None, "events": [], "installed": False}


def _audit(event: str, args: tuple) -> None:
    root = _watch["root"]
    if root is None:
        return
    if event == "open":
        path, _mode, flags = args
        if not isinstance(flags, int) or not flags & _WRITE_FLAGS:
            return
        paths = [path]
    elif event in _CHANGES:
        paths = list(args[:2]) if event in ("os.rename", "os.link", "os.symlink", "shutil.move") else [args[0]]
    else:
        return
    names = [os.path.abspath(os.fsdecode(path)) for path in paths if isinstance(path, (str, bytes, os.PathLike))]
    if any(name == root or name.startswith(root + os.sep) for name in names):
        _watch["events"].append((event, *(os.path.relpath(name, root) for name in names)))


def watch_writes(root: str) -> None:
    """Record from now on what this process writes under ``root`` (see the module docstring)."""
    if not _watch["installed"]:
        sys.addaudithook(_audit)  # for the life of the process; idle while no root is watched
        _watch["installed"] = True
    _watch["root"], _watch["events"] = os.path.abspath(root), []


def stop_watching() -> list[tuple[str, ...]]:
    """The ``(event, path, ...)`` (paths relative to the root; a rename's or link's source and
    target) recorded since :func:`watch_writes`; stops recording."""
    events, _watch["root"], _watch["events"] = _watch["events"], None, []
    return events


def state_copy(module_or_state) -> dict[str, torch.Tensor]:
    state = module_or_state.state_dict() if hasattr(module_or_state, "state_dict") else module_or_state
    return {k: v.detach().clone() for k, v in state.items()}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's per-parameter state as ``{index: {name: tensor}}`` (copies)."""
    return {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in s.items()}
            for k, s in optimizer.state_dict()["state"].items()}


class Hooks:
    """No-op hooks; the classes below override some."""

    def before(self, rank: int) -> None:
        pass

    def setup(self, trainer, rank: int) -> None:
        pass

    def probe(self, trainer, rank: int):
        return None

    def after(self, rank: int) -> None:
        pass


class FineTuneProbe(Hooks):
    """For a fine-tuned run: what each rank writes under ``root``; the weights each rank holds
    before DistributedDataParallel broadcasts rank 0's (so a rank that did not load the parent
    shows its own initialisation); the fields and optimizer state each rank starts with; the
    final weights of each rank."""

    def __init__(self, root: str) -> None:
        self.root = root

    def before(self, rank: int) -> None:
        import nmt.train.trainer as trainer_module

        self._real_wrap = trainer_module.wrap_model
        self._before_ddp = None

        def wrap(model, context):
            self._before_ddp = state_copy(model)
            return self._real_wrap(model, context)

        trainer_module.wrap_model = wrap
        watch_writes(self.root)

    def setup(self, trainer, rank: int) -> None:
        self._start = {"fields": (trainer.data.src_field.state_dict(), trainer.data.tgt_field.state_dict()),
                       "optimizer": optimizer_tensors(trainer.optimizer), "weights": self._before_ddp,
                       "step": trainer.progress.step}

    def probe(self, trainer, rank: int) -> dict:
        return {**self._start, "final": state_copy(trainer.model), "writes": stop_watching()}

    def after(self, rank: int) -> None:
        import nmt.train.trainer as trainer_module

        trainer_module.wrap_model = self._real_wrap
        stop_watching()


class OverflowOnRank(Hooks):
    """fp16 overflows on rank ``rank`` only, at the global data positions ``bad`` ((epoch,
    batch_in_epoch), the same on every rank), injected

    - ``where="gradient"``: by a gradient hook on the first parameter (inf times its gradient,
      before DistributedDataParallel all-reduces it: the inf reaches every rank that way);
    - ``where="after_reduce"``: into the first parameter's all-reduced gradient just before the
      loss scaler unscales it (only this rank's scaler finds it; the skip decision must still be
      every rank's).

    With ``fp32_arithmetic`` autocast is off (the loss scaler stays), as in
    ``test_fp16_overflow.fp32_arithmetic``: updates at two power-of-two scales are then exactly
    proportional. The probe returns each rank's counts, scale, schedule, data position, weights
    and optimizer state."""

    def __init__(self, rank: int, bad: set, where: str, fp32_arithmetic: bool = True) -> None:
        self.rank, self.bad, self.where, self.fp32_arithmetic = rank, set(bad), where, fp32_arithmetic

    def setup(self, trainer, rank: int) -> None:
        if self.fp32_arithmetic:
            trainer.precision.autocast = contextlib.nullcontext
        if rank != self.rank:
            return
        bad = self.bad

        def at_bad_position() -> bool:
            return (trainer.progress.epoch, trainer.progress.batch_in_epoch) in bad

        if self.where == "gradient":
            next(trainer.model.parameters()).register_hook(lambda g: g * math.inf if at_bad_position() else g)
            return
        real_clip = trainer.precision.clip

        def clip(optimizer, params, clip_grad_norm):
            params = list(params)
            if at_bad_position():
                params[0].grad.view(-1)[0] = math.inf
            return real_clip(optimizer, params, clip_grad_norm)

        trainer.precision.clip = clip

    def probe(self, trainer, rank: int) -> dict:
        return {"overflows": trainer.overflows.state_dict(), "scale": trainer.precision.scaler.get_scale(),
                "schedule_steps": trainer.schedule.step_count, "lr": trainer.schedule.lr,
                "progress": (trainer.progress.step, trainer.progress.epoch, trainer.progress.batch_in_epoch),
                "weights": state_copy(trainer.model), "optimizer": optimizer_tensors(trainer.optimizer)}


class ResumeProbe(Hooks):
    """For a resumed run: what each rank writes under ``root``, the checkpoint and step each rank
    resumed from, and its final weights and optimizer state."""

    def __init__(self, root: str) -> None:
        self.root = root

    def before(self, rank: int) -> None:
        watch_writes(self.root)

    def setup(self, trainer, rank: int) -> None:
        self._start = {"resume_path": str(trainer.resume_path), "step": trainer.progress.step,
                       "progress": asdict(trainer.progress)}

    def probe(self, trainer, rank: int) -> dict:
        return {**self._start, "final": state_copy(trainer.model), "optimizer": optimizer_tensors(trainer.optimizer),
                "writes": stop_watching()}

    def after(self, rank: int) -> None:
        stop_watching()


class EmaProbe(Hooks):
    """For a run with ``training.ema``: what each rank writes under ``root``, and each rank's moving
    average, its count of averaging updates and its trained weights at the end."""

    def __init__(self, root: str) -> None:
        self.root = root

    def before(self, rank: int) -> None:
        watch_writes(self.root)

    def probe(self, trainer, rank: int) -> dict:
        return {"average": {n: a.clone() for n, a in zip(trainer.ema.names, trainer.ema.average)},
                "averaged_updates": trainer.ema.averaged_updates, "final": state_copy(trainer.model),
                "writes": stop_watching()}

    def after(self, rank: int) -> None:
        stop_watching()


def build_id_cache(rank: int, data_cfg: dict, work_dir: str, barrier, results, timeout: float) -> None:
    """One of two processes loading the same training data with ``data.id_cache`` at once, as the
    rank 0 of two nmt-train jobs on one node do (:func:`nmt.train.data_setup.load_training_data`,
    fields streamed from the files). The two builds are held inside their
    ``atomic_directory`` blocks until both have filled their temporary (a barrier), so both
    rename onto the same cache directory. Puts ``(rank, "ok", outcome, listing, arrays, src,
    tgt)`` into ``results``: ``outcome`` "won" or "lost" (the rename that found the other's
    directory in place), ``listing`` the cache parent's entries while both temporaries were
    filled, ``arrays`` this process's memory-mapped arrays (copies), ``src``/``tgt`` the
    sentences as id lists; or ``(rank, "error", message, traceback)``."""
    import faulthandler
    import traceback
    from pathlib import Path

    import numpy as np

    faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    try:
        torch.set_num_threads(1)
        import nmt.data.id_arrays as id_arrays
        from nmt.train.data_setup import load_training_data

        real = id_arrays.atomic_directory
        outcome, listing = [], []

        @contextlib.contextmanager
        def racing(path):
            try:
                with real(path) as tmp:
                    yield tmp
                    barrier.wait(timeout)  # both temporaries filled, neither renamed yet
                    listing.extend(sorted(os.listdir(Path(path).parent)))
                    barrier.wait(timeout)  # both listed: now both rename
            except OSError:
                outcome.append("lost")
                raise
            outcome.append("won")

        id_arrays.atomic_directory = racing
        barrier.wait(timeout)  # start together
        data = load_training_data(data_cfg, work_dir)
        train = data.train
        arrays = {name: np.array(a) for name, a in (("src_ids", train.src.ids), ("src_offsets", train.src.offsets),
                                                     ("tgt_ids", train.tgt.ids), ("tgt_offsets", train.tgt.offsets),
                                                     ("src_lengths", train.src_lengths),
                                                     ("tgt_lengths", train.tgt_lengths),
                                                     ("line_numbers", train.line_numbers))}
        results.put((rank, "ok", outcome, listing, arrays, [train.src[i] for i in range(len(train))],
                     [train.tgt[i] for i in range(len(train))]))
    except BaseException as exc:  # reported to the test
        results.put((rank, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        faulthandler.cancel_dump_traceback_later()


class ValidationProbe(Hooks):
    """A validation of the trained model in every rank's share (``ranks=trainer.dist``: each rank
    decodes every second batch, rank 0 merges) and, on rank 0, by itself (the one-process truth);
    what each rank's metrics.jsonl records agree with is checked by the test."""

    def probe(self, trainer, rank: int) -> dict:
        from nmt.sparse import is_softmax
        from nmt.train.validation import validate

        vcfg = trainer.config["validation"]
        kwargs = dict(batch_size=vcfg["batch_size"], device=trainer.device, search=trainer.search,
                      is_softmax=is_softmax(trainer.config["model"]["output"]["mapping"]), metrics=vcfg["metrics"])
        data = trainer.data
        shared = validate(trainer.model, data.valid, data.valid_references, trainer.loss_fn, ranks=trainer.dist,
                          **kwargs)
        alone = validate(trainer.model, data.valid, data.valid_references, trainer.loss_fn, **kwargs) if rank == 0 else None
        out = {"shared": None if shared is None else (shared.scalars, shared.hypotheses)}
        if alone is not None:
            out["alone"] = (alone.scalars, alone.hypotheses)
        return out
