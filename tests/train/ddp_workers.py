"""Run a Trainer in N processes joined as a torchrun job would be (env://, Gloo, CPU).

A :class:`RankPool` spawns its N processes once (importing torch takes seconds on a busy
machine) and runs one training job after another in them; each job joins a fresh process
group on a free port and leaves it at the end. Every wait is bounded: a rank that dies or
hangs fails the test with its rank, exit code or a stack dump (faulthandler), never a hang.

A job may carry ``hooks`` (an instance of a module-level class, so that it pickles: see
``ddp_probes``): ``hooks.before(rank)`` runs before the Trainer is built, ``hooks.setup(trainer,
rank)`` after, ``hooks.probe(trainer, rank)`` after training (its picklable value is the 6th
entry of the rank's result) and ``hooks.after(rank)`` in any case at the end of the job.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import signal
import socket
import time
import traceback


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, world: int, tasks, results) -> None:
    import faulthandler
    import sys

    import torch

    torch.set_num_threads(1)
    from nmt.train.trainer import Trainer
    from nmt.config import resolve_config

    while True:
        task = tasks.get()
        if task is None:
            return
        port, config, signal_at, nan_at, timeout, hooks = task
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)  # a hang shows where
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        trainer = None
        try:
            def hook(step: int) -> None:
                if signal_at.get(rank) == step:
                    os.kill(os.getpid(), signal.SIGTERM)

            if hooks is not None:
                hooks.before(rank)
            trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
            if hooks is not None:
                hooks.setup(trainer, rank)
            if rank in nan_at:  # this rank's loss is NaN at that step (the others' is not)
                trainer.loss_fn = _nan_at(trainer, trainer.loss_fn, nan_at[rank])
            summary = trainer.train(step_hook=hook)
            checksum = float(sum(p.double().sum() for p in trainer.model.parameters()))
            extra = hooks.probe(trainer, rank) if hooks is not None else None
            results.put((rank, "ok", summary.stopped_by, summary.step, checksum, extra))
        except BaseException as exc:  # reported to the test
            results.put((rank, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        finally:
            if trainer is not None:
                trainer.dist.close()
            if hooks is not None:
                hooks.after(rank)
            faulthandler.cancel_dump_traceback_later()


def _nan_at(trainer, loss_fn, step: int):
    """NaN on the first attempt at update ``step`` (with nonfinite: skip a dropped update is not
    counted, so the next batch is a second attempt at the same step: that one is finite)."""
    fired = []

    def loss(*args, **kwargs):
        value = loss_fn(*args, **kwargs)
        if trainer.model.training and trainer.progress.step + 1 == step and not fired:
            fired.append(True)
            return value * float("nan")
        return value
    return loss


class RankPool:
    """``world`` spawned processes that train jobs together (see the module docstring)."""

    def __init__(self, world: int = 2) -> None:
        ctx = mp.get_context("spawn")
        self.world = world
        self.tasks = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_serve, args=(r, world, self.tasks[r], self.results), daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, config: dict, signal_at: dict | None = None, nan_at: dict | None = None, timeout: float = 90.0,
            errors_ok: bool = False, hooks=None) -> list[tuple]:
        """Train ``config`` on every rank; [(rank, 'ok', stopped_by, step, parameter checksum, probe), ...]
        in rank order (probe: ``hooks.probe``'s value, None without hooks; with ``errors_ok`` also
        (rank, 'error', message, traceback) entries)."""
        port = free_port()
        for q in self.tasks:
            q.put((port, config, signal_at or {}, nan_at or {}, timeout, hooks))
        results: list[tuple] = []
        deadline = time.monotonic() + timeout + 60  # the first job also waits for the imports
        while len(results) < self.world:
            try:
                results.append(self.results.get(timeout=0.5))
                continue
            except queue_module.Empty:
                pass
            dead = [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode is not None]
            if dead:
                raise AssertionError(f"rank {dead[0][0]} exited with code {dead[0][1]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no result from ranks {sorted(set(range(self.world)) - {r[0] for r in results})}")
        errors = [r for r in results if r[1] != "ok"]
        if errors and not errors_ok:
            raise AssertionError(f"rank {errors[0][0]} failed: {errors[0][2]}\n{errors[0][3]}")
        return sorted(results)

    def close(self) -> None:
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def ranks_fixture(world: int = 2):
    """A module-scoped pytest fixture body: a :class:`RankPool` of ``world`` ranks, closed after."""
    pool = RankPool(world)
    yield pool
    pool.close()


def gloo_config(data: dict, save_dir, batch_size: int, dropout: float = 0.0, **training) -> dict:
    """``tiny_config`` for the ranks: Gloo on the CPU in every process (also on a CUDA machine,
    whose ranks would need a GPU each), clipping 0.5, ``dropout`` on embeddings and decoder."""
    from tiny_task import tiny_config

    config = tiny_config(data, save_dir, batch_size=batch_size, clip_grad_norm=0.5, device="cpu", **training)
    config["model"]["embeddings"]["dropout"] = dropout
    config["model"]["decoder"]["dropout"] = dropout
    return config
