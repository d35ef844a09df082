#!/usr/bin/env python3
"""Side-by-side timing of OpenNMT-py 3.5.1 (the peer) and nmt on one 2-core CPU machine.

usage: python run_pss.py PHASE [--smoke]
  PHASE: train (training throughput + the 1500-step models for decoding) | decode | all
         | seeds (softmax throughput runs with seeds 2 and 3: other batch orders)
         | throughput (training throughput only: peer, nmt softmax, nmt entmax15, 350 steps, twice)
         | throughput3 (a third repetition of the same three)
         | decode350 (decoding only, 3 repetitions, with the 350-step models copied to
           WORK/models350/{peer,nmt}.pt from a throughput run: no 1,500-step models needed)
         | tf_train (the Transformer of peer_transformer.yaml / nmt_transformer.yaml: 1,500-step
           runs, whose steps 51-350 give the throughput and whose models decode, then a 350-step
           run each) | tf_decode (its beam 5 and greedy searches, 3 repetitions) | tf_entmax
           (nmt's Transformer with 1.5-entmax attention and output: a 1,500-step run, its searches)
         | tf_throughput3 (a 350-step run each of the peer, nmt softmax and nmt 1.5-entmax Transformers)
         | tf_decode_ratio / decode_ratio (the Transformer's / the LSTM's searches with one length
           rule on both sides: the peer without its default -max_length_ratio 1.25, nmt with it)
Every run waits for the go file ($PSS_GO (optional), polled every 30 s), then for an idle machine
(1-minute load average < 1.0 and under 10% of the machine busy over 5 s; `uptime` and the top of
`ps aux --sort=-%cpu` are saved next to the run's log), then runs alone with
OMP_NUM_THREADS=MKL_NUM_THREADS=2. Per run it appends to WORK/results.jsonl: wall time, the
child's CPU time and peak RSS (wait4), and the CPU time that other processes used meanwhile
(/proc/stat busy time minus the child's), which flags a contended run. Runs already in
results.jsonl are skipped, so the script can be restarted. Toolkits alternate (peer, nmt, ...).

Environment: PSS_WORK (default /tmp/pss: data/ from spm.py, peer/ with rnn.yaml and vocabs,
nmt/ a scratch copy of the project with data/multi30k prepared), PEER_VENV (/tmp/peer/venv),
NMT_VENV (the running interpreter's environment), PSS_GO ($PSS_GO (optional)).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

LIB = Path(__file__).resolve().parent
WORK = Path(os.environ.get("PSS_WORK", "/tmp/pss"))
PEER_PY = Path(os.environ.get("PEER_VENV", "/tmp/peer/venv")) / "bin" / "python"
NMT_V = Path(os.environ.get("NMT_VENV", sys.prefix))  # the environment where nmt is installed
GO = Path(os.environ["PSS_GO"]) if os.environ.get("PSS_GO") else None  # optional go file
LOGS = WORK / "logs"
RESULTS = WORK / "results.jsonl"
TICK = os.sysconf("SC_CLK_TCK")
SMOKE = "--smoke" in sys.argv

TRAIN_STEPS = 350  # 50 warm-up + 300 timed
MODEL_STEPS = 1500  # the decoding models


def say(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def cpu_busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = list(map(int, f.readline().split()[1:9]))
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def wait_go() -> None:
    if SMOKE or GO is None:
        return
    waited = False
    while not GO.exists():
        if not waited:
            say(f"waiting for {GO}")
            waited = True
        time.sleep(30)


def wait_idle(name: str) -> tuple[float, float]:
    """Block until load1 < 1.0 and < 10% busy over 5 s; return (load1, busy fraction)."""
    t0 = time.time()
    while True:
        load1 = os.getloadavg()[0]
        b0, a0 = cpu_busy()
        time.sleep(5)
        b1, a1 = cpu_busy()
        busy = (b1 - b0) / max(a1 - a0, 1)
        if SMOKE or (load1 < 1.0 and busy < 0.10):
            break
        if time.time() - t0 > 60 and int(time.time() - t0) % 300 < 35:
            say(f"{name}: waiting for an idle machine (load1 {load1:.2f}, busy {busy:.0%})")
        time.sleep(25)
    snap = subprocess.run("uptime; ps aux --sort=-%cpu | head -8 | cut -c1-160", shell=True,
                          capture_output=True, text=True).stdout
    (LOGS / f"{name}.pre.txt").write_text(snap)
    return load1, busy


def done_names() -> set[str]:
    if not RESULTS.exists():
        return set()
    return {json.loads(line)["name"] for line in RESULTS.read_text().splitlines() if line.strip()}


def proc_cpu(pid: int) -> int:
    """utime + stime of a process (all its threads) and of its waited-for children, in ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15])
    except (OSError, IndexError, ValueError):
        return -1


def sample(pid: int, stop: threading.Event, timeline: list) -> None:
    """Every second: (perf_counter, machine busy ticks, the child's CPU ticks)."""
    while not stop.is_set():
        c = proc_cpu(pid)
        if c >= 0:
            timeline.append((time.perf_counter(), cpu_busy()[0], c))
        stop.wait(1.0)


def run(name: str, cmd: list[str], cwd: Path, env_extra: dict[str, str] | None = None,
        fresh: Path | None = None, attempts: int = 3, window=None) -> None:
    """Run once; a run whose others' CPU exceeds 0.15 cores (over the whole run, or over
    window(name, timeline) when given) is kept as NAME__contendedK and run again."""
    for k in range(1, attempts + 1):
        rec = run_once(name, cmd, cwd, env_extra, fresh)
        if rec is None:
            return
        other = rec["other_frac"] if window is None else window(name, rec)
        if SMOKE or other <= 0.15 or k == attempts:
            return
        say(f"{name}: contended (others {other:.2f} cores), run again")
        lines = RESULTS.read_text().splitlines()
        last = json.loads(lines[-1])
        last["name"], last["contended_window"] = f"{name}__contended{k}", other
        RESULTS.write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")
        for ext in ("out", "err", "steps.json", "cpu.json", "pre.txt"):
            f = LOGS / f"{name}.{ext}"
            if f.exists():
                f.rename(LOGS / f"{name}__contended{k}.{ext}")


def run_once(name: str, cmd: list[str], cwd: Path, env_extra: dict[str, str] | None = None,
             fresh: Path | None = None) -> dict | None:
    if name in done_names():
        say(f"{name}: done before, skipped")
        return None
    wait_go()
    load1, busy = wait_idle(name)
    if fresh is not None and fresh.exists():
        shutil.rmtree(fresh)
    env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    say(f"{name}: start (load1 {load1:.2f}, busy {busy:.0%})")
    b0, _ = cpu_busy()
    w0 = time.perf_counter()
    start = time.time()
    with open(LOGS / f"{name}.out", "w") as out, open(LOGS / f"{name}.err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        timeline: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(proc.pid, stop, timeline), daemon=True)
        sampler.start()
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        sampler.join()
    wall = time.perf_counter() - w0
    b1, _ = cpu_busy()
    (LOGS / f"{name}.cpu.json").write_text(json.dumps({"tick": TICK, "samples": timeline}))
    child = ru.ru_utime + ru.ru_stime
    other = (b1 - b0) / TICK - child
    rec = {"name": name, "cmd": " ".join(cmd), "cwd": str(cwd), "rc": proc.returncode,
           "start": time.strftime("%H:%M:%S", time.localtime(start)), "perf_start": w0,
           "wall_s": round(wall, 3), "cpu_s": round(child, 2), "user_s": round(ru.ru_utime, 2),
           "sys_s": round(ru.ru_stime, 2), "maxrss_kb": ru.ru_maxrss, "other_cpu_s": round(other, 2),
           "other_frac": round(other / wall, 3), "load1_before": round(load1, 2), "busy_before": round(busy, 3)}
    if SMOKE:
        rec["smoke"] = True
    with open(RESULTS, "a") as f:
        f.write(json.dumps(rec) + "\n")
    flag = "  CONTENDED" if rec["other_frac"] > 0.15 else ""
    say(f"{name}: rc {proc.returncode}, wall {wall:.1f} s, cpu {child:.1f} s, others {other:.1f} s{flag}")
    if proc.returncode != 0:
        say(f"{name}: FAILED, see {LOGS / (name + '.err')}")
    return rec


def window_others(name: str, rec: dict, lo: int = 50, hi: int = 350) -> float:
    """Others' CPU (cores) between the ends of steps lo and hi of a training run."""
    try:
        t = json.loads((LOGS / f"{name}.steps.json").read_text())["t"]
        s = json.loads((LOGS / f"{name}.cpu.json").read_text())["samples"]
        t0, t1 = t[lo - 1], t[hi - 1]
    except (OSError, ValueError, IndexError):
        return rec["other_frac"]
    inside = [x for x in s if t0 <= x[0] <= t1]
    if len(inside) < 2:
        return rec["other_frac"]
    (a, b0, c0), (z, b1, c1) = inside[0], inside[-1]
    return ((b1 - b0) - (c1 - c0)) / TICK / (z - a)


# ------------------------------------------------------------------ commands
def peer_train(name: str, steps: int, seed: int | None = None, config: str = "peer/rnn.yaml") -> None:
    save = WORK / "peer" / "runs" / name
    valid = steps if steps == MODEL_STEPS else 100000
    cmd = [str(PEER_PY), str(LIB / "peer_train_wrap.py"), "-config", config,
           "-save_model", f"peer/runs/{name}/model", "-train_steps", str(steps),
           "-valid_steps", str(valid), "-save_checkpoint_steps", str(steps)]
    if seed is not None:
        cmd += ["-seed", str(seed)]
    run(name, cmd, WORK, {"PSS_STEPLOG": str(LOGS / f"{name}.steps.json")}, fresh=save, attempts=2,
        window=window_others)


def nmt_train(name: str, steps: int, entmax: bool = False, seed: int | None = None,
              config: str = "pss_softmax.yaml") -> None:
    nmt = WORK / "nmt"
    sets = [f"training.save_dir=runs/pss/{name}", f"training.max_steps={steps}",
            f"training.valid_every={steps if steps == MODEL_STEPS else 100000}"]
    if entmax:
        sets += ["model.attention.mapping=entmax15", "model.output.mapping=entmax15"]
    if seed is not None:
        sets += [f"training.seed={seed}"]
    cmd = [str(NMT_V / "bin" / "python"), str(LIB / "nmt_train_wrap.py"), "-config", config,
           "-set", *sets]
    run(name, cmd, nmt, {"PSS_STEPLOG": str(LOGS / f"{name}.steps.json"), "PYTHONPATH": str(nmt)},
        fresh=nmt / "runs" / "pss" / name, attempts=2, window=window_others)


PEER_MODEL = f"peer/runs/peer_sm_{MODEL_STEPS}/model_step_{MODEL_STEPS}.pt"
NMT_MODEL = f"runs/pss/nmt_sm_{MODEL_STEPS}/best.pt"
DEC = {
    # name: (toolkit, extra options)
    "peer_beam5": ("peer", ["-beam_size", "5", "-length_penalty", "avg"]),
    "nmt_beam5_avg": ("nmt", ["-beam_size", "5", "-length_penalty", "average"]),
    "nmt_beam5_avg_nocert": ("nmt", ["-beam_size", "5", "-length_penalty", "average", "-no_certify"]),
    "peer_greedy": ("peer", ["-beam_size", "1"]),
    "nmt_greedy": ("nmt", ["-beam_size", "1"]),
    "nmt_greedy_nocert": ("nmt", ["-beam_size", "1", "-no_certify"]),
    "peer_greedy_topk1": ("peer", ["-beam_size", "1", "-random_sampling_topk", "1"]),
    "nmt_beam5_none": ("nmt", ["-beam_size", "5"]),
}
# the Transformer (peer_transformer.yaml, nmt_transformer.yaml): the same searches, its own models
TF_DEC = {
    "peer_tf_beam5": ("peer", ["-beam_size", "5", "-length_penalty", "avg"]),
    "nmt_tf_beam5_avg": ("nmt", ["-beam_size", "5", "-length_penalty", "average"]),
    "peer_tf_greedy": ("peer", ["-beam_size", "1"]),
    "nmt_tf_greedy": ("nmt", ["-beam_size", "1"]),
    "peer_tf_greedy_topk1": ("peer", ["-beam_size", "1", "-random_sampling_topk", "1"]),
}
# The same length rule on both sides. OpenNMT-py stops every sentence of a batch at
# min(max_length, int(1.25 x the batch's longest source + 5)) by default (-max_length_ratio 1.25);
# nmt at max_length alone unless -max_length_ratio is given (then per sentence: floor(1.25 x its
# source) + 5). A model that loops runs 100 steps in nmt and ~1.25 x L + 5 in the peer, so the
# default pairs compare different work: these runs give both toolkits the same rule, either way.
RATIO = ["-max_length_ratio", "1.25", "-max_length_offset", "5"]
NO_RATIO = ["-max_length_ratio", "0"]
TF_RATIO_DEC = {
    "peer_tf_beam5_noratio": ("peer", TF_DEC["peer_tf_beam5"][1] + NO_RATIO),
    "nmt_tf_beam5_avg_ratio": ("nmt", TF_DEC["nmt_tf_beam5_avg"][1] + RATIO),
    "peer_tf_greedy_noratio": ("peer", TF_DEC["peer_tf_greedy"][1] + NO_RATIO),
    "nmt_tf_greedy_ratio": ("nmt", TF_DEC["nmt_tf_greedy"][1] + RATIO),
}
RATIO_DEC = {  # the LSTM's
    "peer_beam5_noratio": ("peer", DEC["peer_beam5"][1] + NO_RATIO),
    "nmt_beam5_avg_ratio": ("nmt", DEC["nmt_beam5_avg"][1] + RATIO),
    "peer_greedy_noratio": ("peer", DEC["peer_greedy"][1] + NO_RATIO),
    "nmt_greedy_ratio": ("nmt", DEC["nmt_greedy"][1] + RATIO),
}
# nmt's Transformer with 1.5-entmax attention (all three kinds) and output (no peer counterpart)
TF_ENT_DEC = {
    "nmt_tf_ent_beam5_avg": ("nmt", ["-beam_size", "5", "-length_penalty", "average"]),
    "nmt_tf_ent_greedy": ("nmt", ["-beam_size", "1"]),
}
TF_STEPS = 1500  # the Transformer's decoding models (its throughput: steps 51-350 of these runs too)


def decode(name: str, rep: int, peer_model: str | None = None, nmt_model: str | None = None) -> None:
    kit, extra = {**DEC, **TF_DEC, **TF_ENT_DEC, **TF_RATIO_DEC, **RATIO_DEC}[name]
    peer_model, nmt_model = peer_model or PEER_MODEL, nmt_model or NMT_MODEL
    (WORK / "dec").mkdir(exist_ok=True)
    tag = f"{name}_r{rep}"
    src_n = "" if not SMOKE else "_smoke"
    if kit == "peer":
        cmd = [str(PEER_PY), str(LIB / "peer_translate_wrap.py"), "-model", peer_model,
               "-src", f"data/test_2016_flickr.sp.de{src_n}", "-output", f"dec/{tag}.sp.hyp",
               "-batch_size", "64", "-batch_type", "sents", "-max_length", "100", "-gpu", "-1",
               "-report_time", *extra]
        run(tag, cmd, WORK, {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    else:
        nmt = WORK / "nmt"
        cmd = [str(NMT_V / "bin" / "nmt-translate"), "-model", nmt_model,
               "-src", f"data/multi30k/test_2016_flickr.de{src_n}", "-output", str(WORK / "dec" / f"{tag}.hyp"),
               "-batch_size", "64", "-max_length", "100", "-threads", "2", *extra]
        run(tag, cmd, nmt, {"PYTHONPATH": str(nmt)})


def main() -> None:
    global TRAIN_STEPS, MODEL_STEPS, PEER_MODEL, NMT_MODEL
    phase = sys.argv[1]
    LOGS.mkdir(parents=True, exist_ok=True)
    shutil.copy(LIB / "nmt_softmax.yaml", WORK / "nmt" / "pss_softmax.yaml")
    shutil.copy(LIB / "nmt_transformer.yaml", WORK / "nmt" / "pss_transformer.yaml")
    shutil.copy(LIB / "peer_transformer.yaml", WORK / "peer" / "transformer.yaml")
    if SMOKE:  # a quick functional check of every command (not timed, not in results)
        global RESULTS
        RESULTS = WORK / "smoke.jsonl"
        RESULTS.unlink(missing_ok=True)
        TRAIN_STEPS, MODEL_STEPS = 6, 12
        PEER_MODEL = f"peer/runs/peer_sm_{MODEL_STEPS}/model_step_{MODEL_STEPS}.pt"
        NMT_MODEL = f"runs/pss/nmt_sm_{MODEL_STEPS}/best.pt"
        for lang_dir, f in ((WORK / "data", "test_2016_flickr.sp.de"), (WORK / "nmt/data/multi30k", "test_2016_flickr.de")):
            lines = (lang_dir / f).read_text().splitlines()[:70]
            (lang_dir / (f + "_smoke")).write_text("\n".join(lines) + "\n")
    if phase in ("train", "all"):
        peer_train(f"peer_sm_{MODEL_STEPS}", MODEL_STEPS)  # repetition 1 (window 50-350) + decoding model
        nmt_train(f"nmt_sm_{MODEL_STEPS}", MODEL_STEPS)
        nmt_train(f"nmt_ent_{TRAIN_STEPS}_r1", TRAIN_STEPS, entmax=True)
        peer_train(f"peer_sm_{TRAIN_STEPS}_r2", TRAIN_STEPS)  # repetition 2
        nmt_train(f"nmt_sm_{TRAIN_STEPS}_r2", TRAIN_STEPS)
        nmt_train(f"nmt_ent_{TRAIN_STEPS}_r2", TRAIN_STEPS, entmax=True)
    if phase == "throughput":  # training throughput only (steps 51-350), no 1,500-step models, no decoding
        for rep in (1, 2):
            peer_train(f"peer_sm_{TRAIN_STEPS}_r{rep}", TRAIN_STEPS)
            nmt_train(f"nmt_sm_{TRAIN_STEPS}_r{rep}", TRAIN_STEPS)
            nmt_train(f"nmt_ent_{TRAIN_STEPS}_r{rep}", TRAIN_STEPS, entmax=True)
    if phase == "throughput3":  # a third repetition: the peer and nmt entmax15/entmax15
        peer_train(f"peer_sm_{TRAIN_STEPS}_r3", TRAIN_STEPS)
        nmt_train(f"nmt_ent_{TRAIN_STEPS}_r3", TRAIN_STEPS, entmax=True)
        nmt_train(f"nmt_sm_{TRAIN_STEPS}_r3", TRAIN_STEPS)
    if phase == "decode350":  # decoding only, with the 350-step models of a throughput run (no 1,500-step models)
        PEER_MODEL, NMT_MODEL = str(WORK / "models350" / "peer.pt"), str(WORK / "models350" / "nmt.pt")
        for rep in (1, 2, 3):
            for name in DEC:
                decode(name, rep)
    if phase in ("decode", "all"):
        for rep in (1, 2, 3):
            for name in DEC:
                decode(name, rep)
    tf_steps = MODEL_STEPS if SMOKE else TF_STEPS
    peer_tf = f"peer/runs/peer_tf_{tf_steps}/model_step_{tf_steps}.pt"
    nmt_tf = f"runs/pss/nmt_tf_{tf_steps}/last.pt"
    if phase == "tf_train":  # the Transformer: throughput (steps 51-350 of the 1,500-step runs, then a 350-step run each)
        peer_train(f"peer_tf_{tf_steps}", tf_steps, config="peer/transformer.yaml")
        nmt_train(f"nmt_tf_{tf_steps}", tf_steps, config="pss_transformer.yaml")
        peer_train(f"peer_tf_{TRAIN_STEPS}_r2", TRAIN_STEPS, config="peer/transformer.yaml")
        nmt_train(f"nmt_tf_{TRAIN_STEPS}_r2", TRAIN_STEPS, config="pss_transformer.yaml")
    if phase == "tf_decode":  # the Transformer's searches, 3 repetitions, with the models of tf_train
        for rep in (1, 2, 3):
            for name in TF_DEC:
                decode(name, rep, peer_tf, nmt_tf)
    if phase == "tf_decode_ratio":  # the Transformer's searches under one length rule (see RATIO), 3 repetitions
        for rep in (1, 2, 3):
            for name in TF_RATIO_DEC:
                decode(name, rep, peer_tf, nmt_tf)
    if phase == "decode_ratio":  # the LSTM's, likewise, with the models of train
        for rep in (1, 2, 3):
            for name in RATIO_DEC:
                decode(name, rep)
    nmt_tf_ent = f"runs/pss/nmt_tf_ent_{tf_steps}/last.pt"
    if phase == "tf_entmax":  # nmt's Transformer with 1.5-entmax attention and output: training, then decoding
        nmt_train(f"nmt_tf_ent_{tf_steps}", tf_steps, entmax=True, config="pss_transformer.yaml")
        for rep in (1, 2, 3):
            for name in TF_ENT_DEC:
                decode(name, rep, peer_tf, nmt_tf_ent)
    if phase == "tf_throughput3":  # one more 350-step run each, alternating: the peer, nmt softmax, nmt 1.5-entmax
        peer_train(f"peer_tf_{TRAIN_STEPS}_r3", TRAIN_STEPS, config="peer/transformer.yaml")
        nmt_train(f"nmt_tf_{TRAIN_STEPS}_r3", TRAIN_STEPS, config="pss_transformer.yaml")
        nmt_train(f"nmt_tf_ent_{TRAIN_STEPS}_r3", TRAIN_STEPS, entmax=True, config="pss_transformer.yaml")
    if phase == "seeds":  # other batch orders (and initialisations): seeds 2 and 3, softmax, 350 steps
        for seed in (2, 3):
            peer_train(f"peer_sm_{TRAIN_STEPS}_seed{seed}", TRAIN_STEPS, seed=seed)
            nmt_train(f"nmt_sm_{TRAIN_STEPS}_seed{seed}", TRAIN_STEPS, seed=seed)
    say("finished")


if __name__ == "__main__":
    main()
