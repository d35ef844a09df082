"""Counting the torch operators a call dispatches below autograd (a ``TorchDispatchMode``).

The one definition behind the host-cost tools (``tools/host_ops.py`` per front-door call,
``tools/bench_host.py`` per training step): every operator that reaches the dispatcher below
autograd (allocations, views, casts, fills and the autograd nodes' own work in a backward) is
counted once, by its overload packet's name (``aten::add.Tensor`` and ``aten::add.out`` both
count as ``add``). Imports torch only, and only when called, so a tool may choose which nmt
checkout it imports first. Not the tests' sync audit (``nmt.utils.sync_audit.SyncAudit``), which
counts host synchronisations, not operators.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Optional


def count_ops(fn: Callable[[], Any], on_op: Optional[Callable[[Any], None]] = None
              ) -> tuple[Any, collections.Counter]:
    """Run ``fn()`` under a dispatch mode counting its operators.

    Returns ``(fn()'s result, Counter: operator name -> calls)``. ``on_op(func)``, where given, is
    called for each operator (the ``OpOverload``) before it runs, from inside the mode (its caller's
    frames are the stack that dispatched the operator: see ``tools/bench_host.py``'s sites).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    names: collections.Counter = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names[str(func.overloadpacket.__name__)] += 1
            if on_op is not None:
                on_op(func)
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn()
    return out, names
