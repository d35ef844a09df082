"""``Coalescer``: waiting jobs of one key run as one group, each gets its own part of the result.

Deterministic: the first job's run blocks on an event while the others queue behind it, then the
groups formed are checked (keys kept apart, None never combined, the size limit, arrival order), and
so are the results, the errors (a failing group reruns each job alone, so only the bad job fails)
and an interrupted run (no job waits forever).
"""
from __future__ import annotations

import threading
import time

import pytest

from nmt.server.coalescing import Coalescer


class Recorder:
    """``run`` for a Coalescer: records each group's payloads; the first call waits for ``release``;
    a payload "bad" fails its group."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, payloads):
        if not self.groups:
            self.started.set()
            assert self.release.wait(30)
        self.groups.append(list(payloads))
        if "bad" in payloads:
            raise ValueError("bad payload")
        return [p.upper() for p in payloads]


def submit_all(coalescer, jobs, first=("k", "first", 1)):
    """Submit ``first`` and, once its run has started, ``jobs`` (key, payload, size) from threads;
    returns payload -> result or exception."""
    results: dict = {}

    def one(key, payload, size):
        try:
            results[payload] = coalescer.submit(key, payload, size)
        except Exception as exc:  # noqa: BLE001
            results[payload] = exc

    threads = [threading.Thread(target=one, args=first)]
    threads[0].start()
    assert coalescer._run.started.wait(30)
    for job in jobs:
        threads.append(threading.Thread(target=one, args=job))
        threads[-1].start()
        time.sleep(0.02)  # arrival order
    deadline = time.time() + 30
    while len(coalescer._waiting) < len(jobs) and time.time() < deadline:
        time.sleep(0.01)
    coalescer._run.release.set()
    for thread in threads:
        thread.join(30)
    return results


def test_waiting_jobs_of_one_key_run_together_in_arrival_order():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_size=10)
    results = submit_all(coalescer, [("k", "b", 2), ("j", "x", 1), ("k", "c", 3), (None, "s", 1), ("k", "d", 4),
                                     ("j", "y", 1), ("k", "e", 2), (None, "t", 1)])
    assert recorder.groups == [["first"], ["b", "c", "d"], ["x", "y"], ["s"], ["e"], ["t"]]
    # "e" did not fit with b, c, d (2 + 3 + 4 + 2 > 10); None-keyed jobs always alone
    assert results == {p: p.upper() for p in ("first", "b", "c", "d", "e", "x", "y", "s", "t")}
    assert coalescer.runs == 6


def test_a_failing_group_reruns_each_job_alone():
    recorder = Recorder()
    coalescer = Coalescer(recorder, max_size=100)
    results = submit_all(coalescer, [("k", "a", 1), ("k", "bad", 1), ("k", "c", 1)])
    assert recorder.groups == [["first"], ["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert results["a"] == "A" and results["c"] == "C" and isinstance(results["bad"], ValueError)


def test_an_interrupted_run_leaves_no_job_waiting():
    class Interrupted(BaseException):
        pass

    calls = []

    def run(payloads):
        calls.append(list(payloads))
        raise Interrupted()

    coalescer = Coalescer(run, max_size=10)
    with pytest.raises(Interrupted):
        coalescer.submit("k", "a", 1)
    assert coalescer.submit.__self__._busy is False and coalescer._waiting == []
    assert calls == [["a"]]


def test_the_shared_lock_is_held_around_every_run():
    lock = threading.Lock()
    held = []
    coalescer = Coalescer(lambda payloads: [held.append(lock.locked()) or p for p in payloads], max_size=4, lock=lock)
    assert coalescer.submit("k", "a", 1) == "a" and coalescer.submit(None, "b", 1) == "b"
    assert held == [True, True]
