"""The CUDA tests' sync detector regions copy nothing from the host.

Most CUDA tests are written on machines without a GPU and first run on a lent one. Their first run
(2026-11-29, an H200) failed five tests in one way: a host tensor copied to the GPU (``x.cuda()``,
``x.to(device)``) *inside* ``torch.cuda.set_sync_debug_mode("error")``, where a copy from pageable
host memory counts as a synchronisation, so the test failed before the library was tested. This
module reads every test file (no GPU needed) and refuses such a copy inside a detector region:
the body of ``with _no_host_sync():`` (or any context manager named ``*no_host_sync*``), and the
``try:`` body after a ``torch.cuda.set_sync_debug_mode("error")`` statement.

Refused there: a ``.cuda(...)`` call; a ``.to(...)`` call given a device (a ``"cuda..."`` string, a
``device=`` keyword, or a name ``device`` / ``cuda``); ``torch.tensor`` / ``torch.as_tensor`` with a
``device=`` keyword. Copy before the detector is on.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DEVICE_NAMES = {"device", "cuda"}


def _is_detector_on(stmt: ast.stmt) -> bool:
    """``torch.cuda.set_sync_debug_mode("error")`` (or ``2``, the same mode) as a statement."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func, args = stmt.value.func, stmt.value.args
    return (isinstance(func, ast.Attribute) and func.attr == "set_sync_debug_mode" and len(args) == 1
            and isinstance(args[0], ast.Constant) and args[0].value in ("error", 2))


def _detector_regions(tree: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists run with the detector on."""
    regions = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            # the manager's call anywhere in the expression (``_no_host_sync() if cuda else nullcontext()``)
            names = [c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                     for item in node.items for c in ast.walk(item.context_expr)
                     if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))]
            if any("no_host_sync" in name for name in names):
                regions.append(node.body)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, after in zip(block, block[1:]):
                if _is_detector_on(stmt) and isinstance(after, ast.Try):
                    regions.append(after.body)
    return regions


def _host_copy(call: ast.Call) -> str | None:
    """What makes ``call`` a host-to-device copy, or None."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cuda":
        return ".cuda()"
    if isinstance(func, ast.Attribute) and func.attr == "to":
        for arg in call.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("cuda"):
                return f'.to("{arg.value}")'
            if isinstance(arg, ast.Name) and arg.id in DEVICE_NAMES:
                return f".to({arg.id})"
        if any(k.arg == "device" for k in call.keywords):
            return ".to(device=...)"
    if (isinstance(func, ast.Attribute) and func.attr in ("tensor", "as_tensor")
            and any(k.arg == "device" for k in call.keywords)):
        return f"torch.{func.attr}(..., device=...)"
    return None


def host_copies_in_detector_regions(source: str, filename: str = "<test>") -> list[str]:
    """``"file:line: what"`` for every host-to-device copy inside a sync detector region of ``source``."""
    tree = ast.parse(source, filename)
    found = set()
    for region in _detector_regions(tree):
        for stmt in region:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call):
                    what = _host_copy(node)
                    if what is not None:
                        found.add((node.lineno, what))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_the_check_finds_the_copies_of_the_first_gpu_run():
    """The three shapes the H200 refused (2026-11-29), and their fixed forms pass."""
    bad = '''
import torch
def t(x, dist, dtype, device, mask, tgt_in, cuda, loss_forward, args):
    with _no_host_sync() if device == "cuda" else contextlib.nullcontext():
        loss = f(x, dist.to(dtype).to(device))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = loss_forward(cuda, *args, src_mask=mask.cuda())
        for t in range(3):
            cuda.step(tgt_in[:, t].to("cuda:0"))
        w = torch.tensor([1.0, 2.0], device=device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
'''
    assert [line.split(": ", 1)[1] for line in host_copies_in_detector_regions(bad)] == [
        ".to(device)", ".cuda()", '.to("cuda:0")', "torch.tensor(..., device=...)"]
    good = '''
import torch
def t(x, dist, dtype, device, mask, cuda, loss_forward, args):
    target = dist.to(dtype).to(device)
    cuda_mask = mask.cuda()
    with _no_host_sync():
        loss = f(x, target)
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = loss_forward(cuda, *args, src_mask=cuda_mask)
        y = loss.to(torch.float32)
    finally:
        torch.cuda.set_sync_debug_mode("default")
'''
    assert host_copies_in_detector_regions(good) == []


def test_no_host_copy_inside_a_sync_detector():
    """Every test file under tests/ (read, not run: CUDA tests skip here)."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        source = path.read_text()
        if "set_sync_debug_mode" in source or "no_host_sync" in source:
            found += host_copies_in_detector_regions(source, path.relative_to(TESTS).as_posix())
    assert found == [], "host-to-device copies inside a sync detector region: " + "; ".join(found)
