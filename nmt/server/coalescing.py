"""Requests that arrive together decoded together (``nmt-server``).

A server answering one request at a time runs one search per request: on a GPU, a request of a few
sentences costs about what one of hundreds does. :class:`Coalescer` lets the threads of waiting
requests hand their work to one of them (the *leader*): the leader takes every waiting job of the
oldest job's key (the same search options), up to a size limit, runs them as one input, and gives
each job its own part of the result. Nothing waits on purpose: a job that finds nobody running
runs at once (alone, or with whatever queued behind a running group).

A job whose key is None is never combined (a request whose result would depend on its neighbours:
sampling's noise is keyed by the sentence's place in the input). If a combined run raises, every
job of the group runs again alone, so each request gets its own result or its own error (an error's
message then names the input's place within that request).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

Payload = TypeVar("Payload")


@dataclass
class _Job(Generic[Payload]):
    key: Hashable | None
    payload: Payload
    size: int
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Coalescer(Generic[Payload]):
    """``run(payloads) -> results`` (one result per payload, in order) on groups of jobs of one key.

    ``max_size``: the most items (the jobs' ``size``) one group holds (a job larger than it runs
    alone). ``lock``: held around every run (shared with other work on the same model). Thread-safe;
    :meth:`submit` blocks until its job has run and returns its result or raises its error."""

    def __init__(self, run: Callable[[Sequence[Payload]], Sequence[Any]], max_size: int,
                 lock: threading.Lock | None = None) -> None:
        self._run, self.max_size = run, max_size
        self._lock = lock or threading.Lock()
        self._cond = threading.Condition()
        self._waiting: list[_Job[Payload]] = []
        self._busy = False
        self.runs = 0  # how many runs there were (for tests and logs)

    def submit(self, key: Hashable | None, payload: Payload, size: int) -> Any:
        """Run ``payload`` (``size`` items), combined with other waiting jobs of the same non-None
        ``key``; its result, or its error raised here."""
        job = _Job(key, payload, size)
        with self._cond:
            self._waiting.append(job)
            while not job.done:
                if self._busy:
                    self._cond.wait()
                    continue
                group = self._take_group()
                self._busy = True
                self._cond.release()
                try:
                    self._run_group(group)
                finally:
                    for other in group:  # interrupted (a BaseException): nobody waits forever
                        if not other.done:
                            other.error, other.done = RuntimeError("the run of this request was interrupted"), True
                    self._cond.acquire()
                    self._busy = False
                    self._cond.notify_all()
        if job.error is not None:
            raise job.error
        return job.result

    def _take_group(self) -> list[_Job[Payload]]:
        """The oldest waiting job and every later one of its key that fits (removed from the queue)."""
        first = self._waiting[0]
        group, total = [first], first.size
        if first.key is not None:
            for job in self._waiting[1:]:
                if job.key == first.key and total + job.size <= self.max_size:
                    group.append(job)
                    total += job.size
        taken = {id(job) for job in group}
        self._waiting = [job for job in self._waiting if id(job) not in taken]
        return group

    def _run_group(self, group: list[_Job[Payload]]) -> None:
        """Run ``group`` as one input; on an error, each job alone. Sets every job's outcome."""
        if len(group) > 1:
            try:
                with self._lock:
                    self.runs += 1
                    results = self._run([job.payload for job in group])
                for job, result in zip(group, results):
                    job.result, job.done = result, True
                return
            except Exception:  # noqa: BLE001 (each job again alone: its own result or error)
                pass
        for job in group:
            try:
                with self._lock:
                    self.runs += 1
                    job.result = self._run([job.payload])[0]
            except Exception as exc:  # noqa: BLE001 (the job's own error, raised in its thread)
                job.error = exc
            job.done = True


__all__ = ["Coalescer"]
