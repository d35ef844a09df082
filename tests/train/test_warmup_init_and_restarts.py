"""``warmup_init_lr`` (the warmup's line starts there instead of 0) and cosine with restarts
(``period_steps``, ``t_mult``, ``lr_shrink``): every update's lr against closed forms recomputed
here in float64 (restarts also against PyTorch's ``CosineAnnealingWarmRestarts``, an independent
implementation, and a cycle-by-cycle simulation for fractional ``t_mult``), the defaults unchanged
to the last bit, config errors naming the key, and kill/resume equality in training."""
import math

import pytest
import torch

from nmt.config import resolve_config
from nmt.train.decay_schedules import cosine_cycle
from nmt.train.schedules import build_schedule
from schedule_checks import BASE, DEFAULTS, assert_config_error, lrs, resumed_lrs_equal_straight
from tiny_task import lr_run, tiny_config


def ramp(init: float, peak: float, s: int, w: int) -> float:
    """Update s (1-based) of a warmup of w updates on the line from init (update 0) to peak (update w)."""
    return init + (peak - init) * s / w


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine", "exponential", "noam", "inverse_sqrt", "plateau"])
def test_default_warmup_init_lr_is_todays_schedule_to_the_last_bit(kind):
    """warmup_init_lr 0 (the default) gives the sequence of a config without the new keys, and its
    warmup is bit for bit the formula of the schedules before the key existed (lr * (t + 1) / w)."""
    cfg = {"type": kind, "warmup_steps": 3, "decay_steps": 4 if kind == "exponential" else None}
    without = {k: v for k, v in {**DEFAULTS, **cfg}.items() if k not in ("warmup_init_lr", "period_steps",
                                                                         "t_mult", "lr_shrink")}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    old = build_schedule(optimizer, BASE, without, 20)
    old_lrs = []
    for _ in range(20):
        old_lrs.append(old.lr)
        old.step()
    seen = lrs({**cfg, "warmup_init_lr": 0.0}, 20, max_steps=20)
    assert seen == old_lrs
    # exact, as the code before: noam lr * s / w, the step schedules lr * ((t + 1) / w)
    assert seen[:2] == [BASE * s / 3 if kind in ("noam", "inverse_sqrt") else BASE * (s / 3) for s in (1, 2)]


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("w,init", [(1, 0.002), (4, 0.002), (5, 0.01)])
def test_warmup_starts_from_warmup_init_lr(kind, w, init):
    total, min_lr = 14, 0.001 if kind != "constant" else 0.0
    cfg = {"type": kind, "warmup_steps": w, "warmup_init_lr": init}
    if kind != "constant":
        cfg["min_lr"] = min_lr
    seen = lrs(cfg, total + 3, max_steps=total)
    expected = [init + (BASE - init) * s / w for s in range(1, w + 1)]  # update w: the peak
    for t in range(w, total + 3):
        p = min(1.0, (t - w) / (total - w))
        if kind == "constant":
            expected.append(BASE)
        elif kind == "linear":
            expected.append(min_lr + (BASE - min_lr) * (1 - p))
        else:
            expected.append(min_lr + 0.5 * (BASE - min_lr) * (1 + math.cos(math.pi * p)))
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert seen[w - 1] == pytest.approx(BASE) and seen[0] == pytest.approx(init + (BASE - init) / w)
    if init < BASE:
        assert seen[:w] == sorted(seen[:w])  # rising from init to the peak


@pytest.mark.parametrize("kind", ["noam", "inverse_sqrt"])
def test_noam_warmup_starts_from_warmup_init_lr(kind):
    w, init, min_lr = 4, 1e-4, 0.002
    seen = lrs({"type": kind, "warmup_steps": w, "warmup_init_lr": init, "min_lr": min_lr}, 200)
    expected = [init + (BASE - init) * s / w if s < w else max(BASE * math.sqrt(w / s), min_lr) for s in range(1, 201)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert seen[w - 1] == pytest.approx(BASE) and seen[-1] == pytest.approx(min_lr)


def test_exponential_warmup_rises_to_the_decayed_rate():
    """A decay inside the warmup: the line from init reaches the rate the decays give at that update."""
    w, init, start, every, factor = 6, 0.001, 3, 2, 0.5
    seen = lrs({"type": "exponential", "warmup_steps": w, "warmup_init_lr": init, "start_decay_steps": start,
                "decay_steps": every, "decay_factor": factor}, 16)
    rate, expected = BASE, []
    for s in range(1, 17):  # OpenNMT-py's simulation: a decay at update start, start + every, ...
        if s >= start and (s - start) % every == 0:
            rate *= factor
        expected.append(init + (rate - init) * s / w if s < w else rate)
    assert seen == pytest.approx(expected, rel=1e-12)


def simulated_restarts(n: int, period: int, t_mult: float, base: float, min_lr: float, shrink: float,
                       w: int = 0) -> list[float]:
    """The lr of updates 1..n after a warmup of w (from 0), walking the cycles one update at a
    time: a cycle of length L starts where the last one ended, the next is t_mult * L long."""
    out = [base * s / w for s in range(1, w + 1)]
    start, length, i = 0.0, float(period), 0
    for u in range(n - w):  # u updates after the warmup
        while u >= start + length:
            start, length, i = start + length, length * t_mult, i + 1
        hi, lo = base * shrink ** i, min_lr * shrink ** i
        out.append(lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * (u - start) / length)))
    return out


@pytest.mark.parametrize("period,t_mult,w,min_lr", [(5, 1, 0, 0.0), (3, 2, 0, 0.001), (4, 1, 2, 0.0),
                                                    (2, 3, 3, 0.0005)])
def test_cosine_restarts_equal_pytorchs_warm_restarts(period, t_mult, w, min_lr):
    """Integer t_mult, no shrink: PyTorch's CosineAnnealingWarmRestarts(T_0=period, T_mult, eta_min)
    after u steps gives the rate of update u + 1 after the warmup."""
    n = 60
    seen = lrs({"type": "cosine", "warmup_steps": w, "period_steps": period, "t_mult": float(t_mult),
                "min_lr": min_lr}, n)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)
    sgdr = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=period, T_mult=t_mult, eta_min=min_lr)
    reference = []
    for _ in range(n - w):
        reference.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        sgdr.step()
    assert seen[:w] == pytest.approx([BASE * s / w for s in range(1, w + 1)], rel=1e-12)
    assert seen[w:] == pytest.approx(reference, rel=1e-12, abs=1e-15)
    assert seen == pytest.approx(simulated_restarts(n, period, t_mult, BASE, min_lr, 1.0, w), rel=1e-12, abs=1e-15)
    # each cycle's first update runs at the peak: after the warmup, at u = 0, P, P + P m, ...
    starts, length, u = [], period, 0
    while u < n - w:
        starts.append(u)
        u, length = u + length, length * t_mult
    assert [seen[w + u] for u in starts] == pytest.approx([BASE] * len(starts))
    assert len(starts) >= 3  # it did restart


@pytest.mark.parametrize("period,t_mult,shrink,w", [(4, 1.5, 0.5, 0), (4, 1.5, 0.8, 3), (3, 1.0, 0.5, 1),
                                                    (8, 1.25, 1.0, 0)])
def test_cosine_restarts_with_fractional_t_mult_and_shrink(period, t_mult, shrink, w):
    """Fractional t_mult (cycles of 4, 6, 9, 13.5, ... updates: their starts 10, 19, 32.5 exact in
    binary, where a logarithm can land a hair below) and lr_shrink (each cycle's peak and floor
    shrink): the walk of simulated_restarts; cosine_cycle at every start is (i, 0, its length)."""
    n, min_lr = 70, 0.001
    seen = lrs({"type": "cosine", "warmup_steps": w, "period_steps": period, "t_mult": t_mult, "lr_shrink": shrink,
                "min_lr": min_lr}, n)
    assert seen == pytest.approx(simulated_restarts(n, period, t_mult, BASE, min_lr, shrink, w), rel=1e-12, abs=1e-15)
    start, length = 0.0, float(period)
    for i in range(12):
        if start == int(start):
            assert cosine_cycle(int(start), period, t_mult) == (i, 0.0, length)
            if start >= 1:  # the update before: the end of the previous cycle
                j, c, previous = cosine_cycle(int(start) - 1, period, t_mult)
                assert j == i - 1 and c == previous - 1 + (start - int(start))
        start, length = start + length, length * t_mult


def test_fairseqs_closed_form_between_cycle_starts():
    """fairseq's cosine (the logarithm of its lr_scheduler/cosine_lr_scheduler.py) gives the same
    rates away from the cycle starts (at them it may pick the previous cycle by rounding)."""
    period, t_mult, shrink, min_lr, w = 4, 1.5, 0.5, 0.001, 0
    seen = lrs({"type": "cosine", "period_steps": period, "t_mult": t_mult, "lr_shrink": shrink, "min_lr": min_lr}, 60)
    checked = 0
    for u in range(60):
        i = math.floor(math.log(1 - u / period * (1 - t_mult), t_mult))
        t_i = t_mult ** i * period
        t_curr = u - (1 - t_mult ** i) / (1 - t_mult) * period
        if t_curr < 1e-9 or t_i - t_curr < 1e-9:
            continue  # at a start: rounding decides fairseq's cycle
        fairseq = min_lr * shrink ** i + 0.5 * (BASE - min_lr) * shrink ** i * (1 + math.cos(math.pi * t_curr / t_i))
        assert seen[u + w] == pytest.approx(fairseq, rel=1e-12)
        checked += 1
    assert checked > 50


@pytest.mark.parametrize("schedule,training,message", [
    ({"warmup_init_lr": 1e-4}, {}, "training.lr_schedule.warmup_init_lr: starts the warmup, but warmup_steps is 0"),
    ({"type": "constant", "warmup_init_lr": 1e-4}, {},
     "training.lr_schedule.warmup_init_lr: starts the warmup, but warmup_steps is 0"),
    ({"type": "noam", "warmup_steps": 3, "warmup_init_lr": 0.01}, {},
     "training.lr_schedule.warmup_init_lr: 0.01 is above training.optimizer.lr 0.001"),
    ({"type": "cosine", "warmup_init_lr": -1.0, "warmup_steps": 2}, {}, "training.lr_schedule.warmup_init_lr: must be"),
    ({"type": "cosine", "t_mult": 2.0}, {}, "training.lr_schedule.t_mult: shapes the cosine schedule's restarts, "
     "which need period_steps"),
    ({"type": "cosine", "lr_shrink": 0.5}, {}, "training.lr_schedule.lr_shrink: shapes the cosine schedule's restarts"),
    ({"type": "cosine", "period_steps": 3, "decay_steps": 10}, {},
     "training.lr_schedule.decay_steps: the cosine schedule with period_steps restarts every cycle"),
    ({"type": "linear", "period_steps": 3}, {},
     "training.lr_schedule.period_steps: the linear schedule does not read it (only cosine)"),
    ({"type": "exponential", "decay_steps": 2, "t_mult": 2.0}, {},
     "training.lr_schedule.t_mult: the exponential schedule does not read it (only cosine)"),
    ({"type": "cosine", "period_steps": 3, "t_mult": 0.5}, {}, "training.lr_schedule.t_mult: must be"),
    ({"type": "cosine", "period_steps": 3, "lr_shrink": 0.0}, {}, "training.lr_schedule.lr_shrink: must be"),
    ({"type": "cosine", "period_steps": 3, "lr_shrink": 1.5}, {}, "training.lr_schedule.lr_shrink: must be"),
    ({"type": "cosine", "period_steps": 0}, {}, "training.lr_schedule.period_steps: must be"),
])
def test_config_errors_are_one_line_naming_the_key(tiny_task, tmp_path, schedule, training, message):
    assert_config_error(tiny_task, tmp_path / "run", schedule, training, message)


def test_restarts_need_no_decay_length(tiny_task, tmp_path):
    """Cosine with period_steps never ends: valid with max_epochs and no max_steps, and with a
    warmup longer than max_steps (no decay length to exceed)."""
    resolve_config(tiny_config(tiny_task, tmp_path / "a", max_steps=None, max_epochs=3,
                               lr_schedule={"type": "cosine", "period_steps": 5}), "tiny.yaml")
    resolve_config(tiny_config(tiny_task, tmp_path / "b", max_steps=4,
                               lr_schedule={"type": "cosine", "period_steps": 5, "warmup_steps": 6,
                                            "warmup_init_lr": 1e-4}), "tiny.yaml")


RESTARTS = {"type": "cosine", "warmup_steps": 2, "warmup_init_lr": 2e-4, "period_steps": 3, "t_mult": 2.0,
            "lr_shrink": 0.5, "min_lr": 1e-4}


def restarts_closed(t: int) -> float:
    """RESTARTS' lr of update t + 1 with optimizer.lr 1e-3: cycles of 3 and 6 updates after the warmup."""
    base, w = 1e-3, 2
    if t < w:
        return 2e-4 + (base - 2e-4) * (t + 1) / w
    u = t - w
    i, c, length = (0, u, 3) if u < 3 else (1, u - 3, 6) if u < 9 else (2, u - 9, 12)
    shrink = 0.5 ** i
    return 1e-4 * shrink + (base - 1e-4) * shrink * (1 + math.cos(math.pi * c / length)) / 2


@pytest.mark.parametrize("schedule", [RESTARTS, {"type": "inverse_sqrt", "warmup_steps": 5, "warmup_init_lr": 1e-4}])
def test_killed_and_resumed_lr_sequence_equals_uninterrupted(tiny_task, tmp_path, schedule):
    straight = resumed_lrs_equal_straight(tiny_task, tmp_path, schedule)
    # the hook sees the lr after step s: the rate of update s + 1
    if schedule is RESTARTS:
        assert [lr for _, lr in straight] == pytest.approx([restarts_closed(s) for s, _ in straight], rel=1e-12)
        # the restarts: the second cycle's first update (6) and the third's (12) at the shrunk peaks
        assert straight[5 - 1][1] == pytest.approx(0.5e-3) and straight[11 - 1][1] == pytest.approx(0.25e-3)
    else:
        assert [lr for _, lr in straight] == pytest.approx(
            [1e-4 + (1e-3 - 1e-4) * (s + 1) / 5 if s + 1 < 5 else 1e-3 * math.sqrt(5 / (s + 1)) for s, _ in straight],
            rel=1e-12)


def test_a_checkpoint_from_before_the_new_keys_resumes_with_them_at_their_defaults(tiny_task, tmp_path, caplog):
    """A last.pt written before warmup_init_lr / period_steps / t_mult / lr_shrink existed (its
    stored config lacks them) resumes as the same run: the schedule is built from the run's own
    checked config, the stored one is only compared, and keys added at their defaults are no
    difference (no 'resuming with changed settings'); the lr sequence equals the uninterrupted run's."""
    import logging

    from nmt.train.checkpoint import load_checkpoint, save_checkpoint

    schedule = {"type": "cosine", "warmup_steps": 2, "min_lr": 1e-4}

    def run(save_dir, kill_at=None):
        return lr_run(tiny_task, save_dir, schedule, kill_at)

    _, _, straight = run(tmp_path / "straight")
    _, summary, first = run(tmp_path / "old", kill_at=7)
    assert summary.step == 7
    last = tmp_path / "old" / "last.pt"
    payload = load_checkpoint(last)
    for key in ("warmup_init_lr", "period_steps", "t_mult", "lr_shrink"):
        del payload["config"]["training"]["lr_schedule"][key]
    save_checkpoint(last, payload)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nmt.train.trainer"):
        trainer, summary, second = run(tmp_path / "old")
    assert trainer.resumed and summary.step == 12
    assert "changed settings" not in caplog.text
    assert first + second == straight


@pytest.mark.parametrize("w,init", [(1, 0.002), (4, 0.002), (5, 0.01)])
def test_plateau_warms_up_from_warmup_init_lr_and_then_halves_on_plateaus(w, init):
    """The plateau schedule's warmup rises on the line from warmup_init_lr (update 0) to lr (update
    w), recomputed here in float64; a plateau during the warmup lowers the line's end, after it
    the rate; the floor holds."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = build_schedule(optimizer, BASE, {**DEFAULTS, "warmup_steps": w, "warmup_init_lr": init,
                                                 "min_lr": BASE / 8})
    seen = []
    for _ in range(w + 2):
        seen.append(optimizer.param_groups[0]["lr"])
        schedule.step()
    assert seen == pytest.approx([ramp(init, BASE, s, w) for s in range(1, w + 1)] + [BASE, BASE], rel=1e-12)
    assert schedule.on_validation(1.0) is False and schedule.on_validation(1.0) is True  # patience 0: halved
    assert optimizer.param_groups[0]["lr"] == pytest.approx(BASE / 2)
    for _ in range(6):
        schedule.on_validation(1.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(BASE / 8)  # the floor
    early = build_schedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0), BASE,
                           {**DEFAULTS, "warmup_steps": 10, "warmup_init_lr": init})
    early.step()  # update 2 of 10 next
    early.on_validation(1.0)
    early.on_validation(1.0)  # halved during the warmup: the line now ends at BASE / 2
    assert early.lr == pytest.approx(init + (BASE / 2 - init) * 2 / 10, rel=1e-12)
