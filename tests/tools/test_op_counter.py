"""tools/op_counter.py: the operator counter shared by host_ops.py and bench_host.py.

The truth is written out by hand: the aten operators a few eager calls dispatch (an addition,
an in-place multiply, a matrix product, a sum), and the backward of ``(a * b).sum()`` for ``a``
alone: the implicit output gradient (``ones_like``, outside any node), ``SumBackward0``'s
``expand`` and ``MulBackward0``'s one ``mul`` (``b`` needs no gradient)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _load():
    spec = importlib.util.spec_from_file_location("op_counter", TOOLS / "op_counter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_each_dispatched_operator_by_name_and_returns_the_result():
    count_ops = _load().count_ops
    a, b = torch.ones(3, 3), torch.full((3, 3), 2.0)

    def calls() -> torch.Tensor:
        c = a + b
        c.mul_(b)
        return (c @ b).sum()

    out, names = count_ops(calls)
    assert out.item() == 9 * 36.0  # every entry of c is (1 + 2) x 2 = 6, of c @ b 3 x 6 x 2 = 36
    assert dict(names) == {"add": 1, "mul_": 1, "mm": 1, "sum": 1}


def test_on_op_sees_every_operator_and_backward_nodes_dispatch_below_autograd():
    count_ops = _load().count_ops
    a = torch.randn(4, requires_grad=True)
    b = torch.randn(4)
    loss = (a * b).sum()
    seen: list[tuple[str, str | None]] = []

    def on_op(func) -> None:
        node = torch._C._current_autograd_node()
        seen.append((str(func.overloadpacket.__name__), None if node is None else node.name()))

    (grad,), names = count_ops(lambda: torch.autograd.grad(loss, [a]), on_op)
    assert torch.equal(grad, b)
    assert dict(names) == {"ones_like": 1, "expand": 1, "mul": 1}
    assert seen == [("ones_like", None), ("expand", "SumBackward0"), ("mul", "MulBackward0")]
