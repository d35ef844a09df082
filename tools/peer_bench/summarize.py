#!/usr/bin/env python3
"""Tables of the side-by-side runs (run_pss.py): training throughput, decoding speed, BLEU.

usage: python summarize.py [WORK]   (WORK default /tmp/pss; needs sacrebleu and sentencepiece,
e.g. the peer venv's python). Prints markdown.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
import statistics
import sys
from pathlib import Path

WORK = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/pss")
LOGS = WORK / "logs"
CONTENDED = 0.15  # other processes' CPU, in cores, averaged over the run


def results() -> dict[str, dict]:
    out = {}
    for line in (WORK / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[r["name"]] = r
    return out


R = results()


def text(name: str) -> str:
    return "".join((LOGS / f"{name}.{ext}").read_text(errors="replace") for ext in ("out", "err")
                   if (LOGS / f"{name}.{ext}").exists())


def logged_speeds(name: str, lo: int, hi: int) -> list[float]:
    """The toolkit's own target tokens/s for the logging windows ending at steps in (lo, hi]."""
    t = text(name)
    if name.startswith("peer"):
        pairs = [(int(s), float(v)) for s, v in re.findall(r"Step\s+(\d+)/\s*\d+;.*?\d+/\s*(\d+) tok/s", t)]
    else:
        pairs = [(int(s), float(v)) for s, v in re.findall(r"step (\d+) \(epoch \d+\): .*?, ([\d.]+) tokens/s", t)]
    return [v for s, v in pairs if lo < s <= hi]


def window(name: str, lo: int, hi: int) -> dict:
    steps = json.loads((LOGS / f"{name}.steps.json").read_text())
    t, tok = steps["t"], steps["tokens"]
    secs = t[hi - 1] - t[lo - 1]
    n = sum(tok[lo:hi])
    logged = logged_speeds(name, lo, hi)
    cpu = json.loads((LOGS / f"{name}.cpu.json").read_text())
    inside = [x for x in cpu["samples"] if t[lo - 1] <= x[0] <= t[hi - 1]]
    (a, b0, c0), (z, b1, c1) = inside[0], inside[-1]
    others = ((b1 - b0) - (c1 - c0)) / cpu["tick"] / (z - a)
    sub = [sum(tok[a:a + 50]) / (t[a + 49] - t[a - 1]) for a in range(lo, hi, 50)]
    clean_tok = clean_s = 0.0  # 50-step sub-windows in which other processes used < CONTENDED cores
    for a in range(lo, hi, 50):
        s0, s1 = t[a - 1], t[a + 49]
        ins = [x for x in cpu["samples"] if s0 <= x[0] <= s1]
        if len(ins) >= 2 and ((ins[-1][1] - ins[0][1]) - (ins[-1][2] - ins[0][2])) / cpu["tick"] / (ins[-1][0] - ins[0][0]) < CONTENDED:
            clean_tok += sum(tok[a:a + 50])
            clean_s += s1 - s0
    pad = {}
    if "tgt_cells" in steps:
        pad = {"tgt_pad": sum(steps["tgt_cells"][lo:hi]) / n,
               "src_pad": sum(steps["src_cells"][lo:hi]) / sum(steps["src_tokens"][lo:hi])}
    return {**pad, "others": others, "own_median": statistics.median(sub), "clean_tok_s": clean_tok / clean_s if clean_s else float("nan"),
            "clean_secs": clean_s, "steps": hi - lo, "tokens": n, "secs": secs, "tok_s": n / secs, "steps_s": (hi - lo) / secs,
            "logged_median": statistics.median(logged) if logged else float("nan"), "n_logged": len(logged),
            "first_step_s": t[0] - R[name]["perf_start"]}


def fmt(x: float, d: int = 0) -> str:
    return f"{x:,.{d}f}"


def train_tables() -> None:
    groups = {
        "OpenNMT-py 3.5.1, softmax/softmax": ["peer_sm_1500", "peer_sm_350_r1", "peer_sm_350_r2", "peer_sm_350_r3"],
        "nmt, softmax/softmax": ["nmt_sm_1500", "nmt_sm_350_r1", "nmt_sm_350_r2", "nmt_sm_350_r3"],
        "nmt, entmax15/entmax15": ["nmt_ent_350_r1", "nmt_ent_350_r2", "nmt_ent_350_r3"],
        "OpenNMT-py 3.5.1, softmax/softmax, seeds 2, 3": ["peer_sm_350_seed2", "peer_sm_350_seed3"],
        "nmt, softmax/softmax, seeds 2, 3": ["nmt_sm_350_seed2", "nmt_sm_350_seed3"],
    }
    print("### Training throughput, steps 51-350 (300 steps of 64 sentences after 50 warm-up steps)\n")
    print("| toolkit, attention/output | run | target tokens | seconds | own tok/s | steps/s | logged tok/s "
          "(median of 6 windows) | start to step 1 (s) | peak RSS (GB) | others' CPU in the window (cores) "
          "| padded/real positions, target; source |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    means = {}
    for label, names in groups.items():
        own, logged = [], []
        for name in names:
            if name not in R or not (LOGS / f"{name}.steps.json").exists():
                continue
            w = window(name, 50, 350)
            own.append(w["tok_s"])
            logged.append(w["logged_median"])
            r = R[name]
            flag = " (contended)" if w["others"] > CONTENDED else ""
            print(f"| {label} | {name} | {fmt(w['tokens'])} | {w['secs']:.1f} | {fmt(w['tok_s'])} | "
                  f"{w['steps_s']:.3f} | {fmt(w['logged_median'])} | {w['first_step_s']:.1f} | "
                  f"{r['maxrss_kb'] / 1e6:.2f} | {w['others']:.2f}{flag} | "
                  + (f"{w['tgt_pad']:.3f}; {w['src_pad']:.3f} |" if "tgt_pad" in w else "(not recorded) |"))
        if own:
            means[label] = (statistics.mean(own), statistics.mean(logged))
            print(f"| {label} | **mean** | | | **{fmt(means[label][0])}** | | **{fmt(means[label][1])}** | | | |")
    print("\nRatios nmt/peer (tokens/s, means of the runs):\n")
    for label, (o, lg) in means.items():
        if not label.startswith("nmt"):
            continue
        peer_label = "OpenNMT-py 3.5.1, softmax/softmax" + (", seeds 2, 3" if "seeds" in label else "")
        if peer_label in means:
            p = means[peer_label]
            print(f"- {label} vs {peer_label}: own count {o / p[0]:.3f}, logged {lg / p[1]:.3f}")
    print("\n### Long window of the 1,500-step runs (steps 51-1500, validation and checkpoint excluded)\n")
    print("| run | target tokens | seconds | own tok/s | steps/s | own tok/s, median of 29 windows of 50 steps | "
          "logged tok/s (median of 29 windows) | others' CPU in the window (cores) | own tok/s over the uncontended "
          "50-step windows (their seconds) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("peer_sm_1500", "nmt_sm_1500"):
        if name in R:
            w = window(name, 50, 1500)
            print(f"| {name} | {fmt(w['tokens'])} | {w['secs']:.1f} | {fmt(w['tok_s'])} | {w['steps_s']:.3f} | "
                  f"{fmt(w['own_median'])} | {fmt(w['logged_median'])} | {w['others']:.2f} | "
                  f"{fmt(w['clean_tok_s'])} ({w['clean_secs']:.0f}) |")
    for name in ("peer_sm_1500", "nmt_sm_1500"):
        if name in R:
            t = text(name)
            lines = [ln for ln in t.splitlines() if re.search(r"Validation (perplexity|accuracy)|step 1500 valid", ln)]
            print(f"\n{name} validation at step 1500: " + "; ".join(ln.split("] ")[-1].split(" INFO ")[-1] for ln in lines))


DEC = [
    ("beam 5, length penalty avg", "peer_beam5", "nmt_beam5_avg"),
    ("beam 5, length penalty avg, nmt -no_certify", "peer_beam5", "nmt_beam5_avg_nocert"),
    ("greedy (beam 1)", "peer_greedy", "nmt_greedy"),
    ("greedy (beam 1), nmt -no_certify", "peer_greedy", "nmt_greedy_nocert"),
    ("greedy, peer GreedySearch (-random_sampling_topk 1)", "peer_greedy_topk1", "nmt_greedy_nocert"),
    ("beam 5, nmt's default length penalty (none) vs peer's default (avg)", "peer_beam5", "nmt_beam5_none"),
    ("beam 5, both -max_length_ratio 1.25 (+5)", "peer_beam5", "nmt_beam5_avg_ratio"),
    ("beam 5, neither length ratio", "peer_beam5_noratio", "nmt_beam5_avg"),
    ("greedy, both -max_length_ratio 1.25 (+5)", "peer_greedy", "nmt_greedy_ratio"),
    ("greedy, neither length ratio", "peer_greedy_noratio", "nmt_greedy"),
]


def dec_rep(name: str, rep: int) -> dict | None:
    tag = f"{name}_r{rep}"
    if tag not in R:
        return None
    t = text(tag)
    r = R[tag]
    d = {"wall": r["wall_s"], "other": r["other_frac"], "rss": r["maxrss_kb"], "cpu": r["cpu_s"]}
    if name.startswith("peer"):
        m = re.search(r"PSS translate_seconds ([\d.]+)", t)
        d["trans"] = float(m.group(1)) if m else float("nan")
        m = re.search(r"Total translation time \(s\): ([\d.]+)", t)
        d["reported"] = float(m.group(1)) if m else float("nan")
        d["hyp"] = WORK / "dec" / f"{tag}.sp.hyp"
    else:
        m = re.search(r"(\d+) sentences; .*?; ([\d.]+) sentences/s \(([\d.]+) with start-up\); start-up ([\d.]+) s", t)
        n, sps, sps_all, start = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
        d["trans"] = n / sps
        d["reported"] = sps
        d["startup"] = start
        d["hyp"] = WORK / "dec" / f"{tag}.hyp"
        c = re.search(r"certified ([\d.]+)%", t)
        d["certified"] = float(c.group(1)) if c else None
    return d


@functools.lru_cache(maxsize=1)
def pieces_model():
    """The harness's sentencepiece model (WORK/data/spm8000.model), loaded once."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(WORK / "data" / "spm8000.model"))


def detok(name: str, lines: list[str]) -> list[str]:
    """A run's output lines as text (the peer writes pieces)."""
    if not name.startswith("peer"):
        return lines
    return [pieces_model().decode_pieces(line.split()) for line in lines]


def output_pieces(name: str, lines: list[str]) -> list[int]:
    """Pieces per output line, counted with the harness's sentencepiece model for both toolkits
    (the peer writes pieces; nmt's detokenized lines are encoded again): decoding ratios compare
    the same work only where both wrote about as many pieces, and as few at max_length."""
    if name.startswith("peer"):
        return [len(line.split()) for line in lines]
    return [len(pieces_model().encode(line)) for line in lines]


def dec_summary(name: str) -> dict | None:
    reps = [d for d in (dec_rep(name, i) for i in (1, 2, 3)) if d is not None]
    if not reps:
        return None
    import sacrebleu

    refs = (WORK / "nmt" / "data" / "multi30k" / "test_2016_flickr.en").read_text(encoding="utf-8").split("\n")[:-1]
    outputs = reps[0]["hyp"].read_text(encoding="utf-8").split("\n")[:-1]
    hyps = detok(name, outputs)
    digests = {hashlib.md5(d["hyp"].read_bytes()).hexdigest() for d in reps}
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    pieces = output_pieces(name, outputs)
    bleu = bleu_metric.corpus_score(hyps, [refs])
    chrf = chrf_metric.corpus_score(hyps, [refs])
    return {"n": len(reps), "trans": statistics.median(d["trans"] for d in reps),
            "trans_all": [d["trans"] for d in reps], "wall": statistics.median(d["wall"] for d in reps),
            "wall_all": [d["wall"] for d in reps], "other_max": max(d["other"] for d in reps),
            "rss": max(d["rss"] for d in reps) / 1e6, "bleu": bleu.score, "chrf": chrf.score,
            "same_output": len(digests) == 1, "sig": f"BLEU {bleu_metric.get_signature()}, chrF {chrf_metric.get_signature()}",
            "startup": statistics.median(d["startup"] for d in reps) if "startup" in reps[0] else None,
            "certified": reps[0].get("certified"), "pieces": sum(pieces),
            "long": sum(n >= LONG_OUTPUT for n in pieces)}


LONG_OUTPUT = 50
"""Outputs of at least this many pieces (the test set's references have at most 40-odd): loops."""


def dec_tables() -> None:
    names = ["peer_beam5", "peer_greedy", "peer_greedy_topk1", "nmt_beam5_avg", "nmt_beam5_avg_nocert",
             "nmt_beam5_none", "nmt_greedy", "nmt_greedy_nocert", "peer_beam5_noratio", "nmt_beam5_avg_ratio",
             "peer_greedy_noratio", "nmt_greedy_ratio"]
    S = {n: dec_summary(n) for n in names}
    print("\n### Decoding test_2016_flickr (1,000 sentences), batch 64 sentences, max_length 100, "
          "medians of 3 runs\n")
    print("| toolkit, decoding | BLEU | chrF | translate-only s (3 runs) | translate-only sent/s | wall s incl. "
          f"start-up (3 runs) | wall sent/s | peak RSS GB | others' CPU max (cores) | identical output | output pieces "
          f"(outputs of {LONG_OUTPUT}+) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for n in names:
        s = S[n]
        if s is None:
            continue
        print(f"| {n} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['trans']:.2f} ({', '.join(f'{x:.2f}' for x in s['trans_all'])}) | "
              f"{1000 / s['trans']:.0f} | {s['wall']:.2f} ({', '.join(f'{x:.2f}' for x in s['wall_all'])}) | "
              f"{1000 / s['wall']:.0f} | {s['rss']:.2f} | {s['other_max']:.2f} | {'yes' if s['same_output'] else 'NO'} | "
              f"{s['pieces']:,} ({s['long']}) |")
    print("\nRatios nmt/peer (speed = sentences/s; > 1: nmt faster):\n")
    print("| comparison | translate-only | wall incl. start-up | BLEU difference (nmt - peer) |")
    print("|---|---:|---:|---:|")
    for label, p, m in DEC:
        if S.get(p) and S.get(m):
            print(f"| {label} | {S[p]['trans'] / S[m]['trans']:.2f} | {S[p]['wall'] / S[m]['wall']:.2f} | "
                  f"{S[m]['bleu'] - S[p]['bleu']:+.2f} |")
    any_s = next((s for s in S.values() if s), None)
    if any_s:
        print(f"\nsacrebleu signature: {any_s['sig']}")
        for n in names:
            if S[n] and S[n]["startup"] is not None:
                print(f"- {n}: nmt-translate's own start-up figure, median {S[n]['startup']:.2f} s")


def tf_tables() -> None:
    """The Transformer (run_pss.py tf_train / tf_decode): throughput over steps 51-350, the searches."""
    groups = {"OpenNMT-py 3.5.1": ["peer_tf_1500", "peer_tf_350_r2", "peer_tf_350_r3"],
              "nmt": ["nmt_tf_1500", "nmt_tf_350_r2", "nmt_tf_350_r3"],
              "nmt, 1.5-entmax attention and output": ["nmt_tf_ent_1500", "nmt_tf_ent_350_r3"]}
    if not any(n in R for names in groups.values() for n in names):
        return
    print("\n### Transformer (3+3 layers, d_model 256): training throughput, steps 51-350\n")
    print("| toolkit | run | target tokens/s | steps/s | others' CPU (cores) | padded/real positions, target; source |")
    print("|---|---|---:|---:|---:|---|")
    means = {}
    for label, names in groups.items():
        speeds = []
        for name in names:
            if name not in R or not (LOGS / f"{name}.steps.json").exists():
                continue
            w = window(name, 50, 350)
            speeds.append(w["tok_s"])
            flag = " (contended)" if w["others"] > CONTENDED else ""
            print(f"| {label} | {name} | {fmt(w['tok_s'])} | {w['steps_s']:.3f} | {w['others']:.2f}{flag} | "
                  + (f"{w['tgt_pad']:.3f}; {w['src_pad']:.3f} |" if "tgt_pad" in w else "(not recorded) |"))
        if speeds:
            means[label] = statistics.mean(speeds)
            print(f"| {label} | **mean** | **{fmt(means[label])}** | | | |")
    if "nmt" in means and "OpenNMT-py 3.5.1" in means:
        print(f"\nnmt / OpenNMT-py, target tokens/s: **{means['nmt'] / means['OpenNMT-py 3.5.1']:.2f}x**")
    ent = "nmt, 1.5-entmax attention and output"
    if ent in means and "nmt" in means:
        print(f"\n{ent} / nmt softmax, target tokens/s: **{means[ent] / means['nmt']:.2f}x**")
    names = ["peer_tf_beam5", "nmt_tf_beam5_avg", "peer_tf_greedy", "nmt_tf_greedy", "peer_tf_greedy_topk1",
             "nmt_tf_ent_beam5_avg", "nmt_tf_ent_greedy", "peer_tf_beam5_noratio", "nmt_tf_beam5_avg_ratio",
             "peer_tf_greedy_noratio", "nmt_tf_greedy_ratio"]
    S = {n: dec_summary(n) for n in names}
    if not any(S.values()):
        return
    print("\n### Transformer: decoding test_2016_flickr, batch 64, medians of 3 runs\n")
    print(f"| run | BLEU | translate-only s (3 runs) | sent/s | wall s | peak RSS GB | identical output | certified | "
          f"output pieces (outputs of {LONG_OUTPUT}+) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for n in names:
        if S[n]:
            x = S[n]
            cert = "" if x["certified"] is None else f"{x['certified']:.1f}%"
            print(f"| {n} | {x['bleu']:.2f} | {x['trans']:.2f} ({', '.join(f'{v:.2f}' for v in x['trans_all'])}) | "
                  f"{1000 / x['trans']:.0f} | {x['wall']:.2f} | {x['rss']:.2f} | {'yes' if x['same_output'] else 'NO'} | {cert} | "
                  f"{x['pieces']:,} ({x['long']}) |")
    print()
    for label, p, m in (("beam 5, length penalty avg", "peer_tf_beam5", "nmt_tf_beam5_avg"),
                        ("greedy", "peer_tf_greedy", "nmt_tf_greedy"),
                        ("greedy, peer GreedySearch", "peer_tf_greedy_topk1", "nmt_tf_greedy"),
                        ("beam 5, both -max_length_ratio 1.25 (+5)", "peer_tf_beam5", "nmt_tf_beam5_avg_ratio"),
                        ("beam 5, neither length ratio", "peer_tf_beam5_noratio", "nmt_tf_beam5_avg"),
                        ("greedy, both -max_length_ratio 1.25 (+5)", "peer_tf_greedy", "nmt_tf_greedy_ratio"),
                        ("greedy, neither length ratio", "peer_tf_greedy_noratio", "nmt_tf_greedy")):
        if S.get(p) and S.get(m):
            print(f"- {label}: nmt {S[p]['trans'] / S[m]['trans']:.2f}x the peer (translate-only), "
                  f"{S[p]['wall'] / S[m]['wall']:.2f}x with start-up; BLEU {S[m]['bleu'] - S[p]['bleu']:+.2f}")


if __name__ == "__main__":
    train_tables()
    dec_tables()
    tf_tables()
