#!/usr/bin/env python
"""Benchmark nmt-translate: sentences/second of greedy and beam-5 search, softmax vs entmax15
outputs, with the exactness certificate on and off, and the start-up time (interpreter,
imports and model load, measured in a fresh process).

Models: ``--checkpoint softmax=A.pt --checkpoint entmax15=B.pt`` (e.g. trained with
configs/multi30k_lstm.yaml), or, without them, the Multi30k LSTM of configs/multi30k_lstm.yaml
(2x256 bi-LSTM encoder, 2x256 decoder, sentencepiece 8000), or with ``--model transformer`` the
Transformer of recipes/translation/configs/multi30k_transformer_softmax.yaml (3+3 layers, d_model
256), trained here for ``--train_steps`` steps with each output mapping (a briefly trained model still produces
sentences of realistic length; the per-step cost is that of the real architecture).
Source: Multi30k test_2016_flickr.de (1,000 sentences) from ``--data-dir`` (default data/multi30k).
No peer figure is printed here: OpenNMT-py is timed side by side, in the same session, by the
harness in tools/peer_bench (``run_pss.py decode350``).

    python tools/bench_translate.py                 # full run (trains 2 models: minutes)
    python tools/bench_translate.py --quick         # smoke run: 5 steps, 48 sentences, max_length 30
    python tools/bench_translate.py --work runs/bench  # keep (and reuse) the trained models
    python tools/bench_translate.py --checkpoint softmax=s.pt --checkpoint entmax15=e.pt
    python tools/bench_translate.py --device cuda --checkpoint ...   # GPU section
    python tools/bench_translate.py --model transformer --max_length_ratio 1.25   # the Transformer

A second table compares the search loops (``SearchOptions.mode``): dynamic (finished sentences
leave the batch, one host sync per step) and static (fixed shapes, finished sentences masked,
a stop flag read every ``--stop_every`` steps): sentences/s, ms per step and host syncs per step
of one batch (SyncAudit's count on the CPU, CUDA's sync debug mode on CUDA; on the CPU the count
includes the host reads of CPU-only paths, which never run on an accelerator: the encoder's lengths,
the decoder step's check for new tokens of its per-token products), and how many sentences'
outputs or certificates differ. A third table times nmt-translate's default options for the
device (on a GPU: batches of 8,192 source tokens) and, with ``--compare-cpu`` (default on a
GPU), counts the sentences whose hypotheses, certificates or n_nonzero differ from the CPU's. A
fourth table times ``-sample`` (N = 1, 4; a temperature; ``-block_ngram_repeat 3``) with the static
and the dynamic sampling loop, and beam 5 with and without ``-block_ngram_repeat 3``. ``--tables``
picks tables, ``--only-given`` times the ``--checkpoint`` models alone (e.g. the quick-start model:
``--only-given --checkpoint entmax15=runs/quickstart/best.pt --src data/quickstart/valid.src
--tables sampling``). ``--load`` labels figures taken on a busy machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nmt.translate.search_options import SearchOptions

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"lstm": ROOT / "configs" / "multi30k_lstm.yaml",
           "transformer": ROOT / "recipes" / "translation" / "configs" / "multi30k_transformer_softmax.yaml"}
DATA_DIR = ROOT / "data" / "multi30k"  # what recipes/translation/prepare.py multi30k writes


def train_model(mapping: str, work: Path, steps: int, valid_lines: int | None, data_dir: Path = DATA_DIR,
                model: str = "lstm") -> Path:
    """Train the Multi30k ``model`` (the LSTM of configs/multi30k_lstm.yaml, or the Transformer of
    the Multi30k Transformer recipe) with ``mapping`` outputs for ``steps`` steps; returns best.pt
    (reused when ``work/mapping/best.pt``, the Transformer's ``work/transformer_mapping/best.pt``,
    exists). ``valid_lines`` shortens validation."""
    from nmt.cli import train as train_cli

    save_dir = work / (mapping if model == "lstm" else f"{model}_{mapping}")
    if (save_dir / "best.pt").is_file():
        return save_dir / "best.pt"
    print(f"training the {model} with {mapping} outputs for {steps} steps ...", file=sys.stderr)
    overrides = [f"data.train.src={data_dir / 'train.de'}", f"data.train.tgt={data_dir / 'train.en'}",
                 f"data.valid.src={data_dir / 'val.de'}", f"data.valid.tgt={data_dir / 'val.en'}"]
    if valid_lines:
        valid = data_dir
        for side in ("de", "en"):
            head = (valid / f"val.{side}").read_text(encoding="utf-8").split("\n")[:valid_lines]
            (work / f"val.{side}").write_text("\n".join(head) + "\n", encoding="utf-8")
        overrides += [f"data.valid.src={work / 'val.de'}", f"data.valid.tgt={work / 'val.en'}"]
    overrides += [f"model.output.mapping={mapping}", f"training.save_dir={save_dir}",
                 f"training.max_steps={steps}", f"training.valid_every={steps}", "training.keep_last=1",
                 "training.progress=false", "validation.decode=false", "validation.metric=loss",
                 "validation.n_heatmaps=0", "training.log_every=1000", "training.max_minutes=null"]
    cwd = os.getcwd()
    os.chdir(ROOT)  # the config's data paths are relative to the project root
    try:
        code = train_cli.main(["-config", str(CONFIGS[model]), "-quiet", "-set", *overrides])
    finally:
        os.chdir(cwd)
    if code != 0:
        raise SystemExit(f"bench_translate: training the {mapping} model failed (exit {code})")
    return save_dir / "best.pt"


def search_options(args: argparse.Namespace, beam_size: int, **fields) -> SearchOptions:
    """The ``SearchOptions`` of every timed search: ``beam_size``, the length flags (``--max_length``,
    ``--max_length_ratio``) and ``fields``."""
    from nmt.translate.search_options import SearchOptions

    return SearchOptions(beam_size=beam_size, max_length=args.max_length, max_length_ratio=args.max_length_ratio,
                         **fields)


def startup_seconds(checkpoint: Path, repeats: int) -> float:
    """Median wall time of a fresh interpreter that imports nmt-translate and loads the model."""
    code = ("import nmt.cli.translate; from nmt.translate.loading import load_models; "
            f"load_models([{str(checkpoint)!r}])")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_settings(translators: dict, lines: list[str], repeats: int) -> tuple[dict, dict]:
    """Best-of-``repeats`` wall time of translating ``lines`` with each translator (after one
    warm-up batch each); the settings are interleaved within every repeat, so a slow spell of
    the machine hits all of them alike. Returns ``(seconds, outputs)`` per setting."""
    for translator in translators.values():
        translator.translate(lines[: translator.batch_size])
    best = {key: float("inf") for key in translators}
    outputs: dict = {}
    for _ in range(repeats):
        for key, translator in translators.items():
            start = time.perf_counter()
            outputs[key] = translator.translate(lines)
            best[key] = min(best[key], time.perf_counter() - start)
    return best, outputs


def search_mode_rows(checkpoints: dict, lines: list[str], args: argparse.Namespace) -> list[dict]:
    """Dynamic vs static search per output mapping and beam size (see the module docstring)."""
    from nmt.data.batching import encode_sources
    from nmt.models import encoder as encoder_module
    from nmt.translate.beam_search import beam_search
    from nmt.translate.loading import load_model
    from nmt.translate.translator import Translator
    from nmt.utils.host_syncs import count_host_syncs_on
    from nmt.utils.precision import inference_precision

    rows = []
    for mapping, path in checkpoints.items():
        loaded = load_model(path, args.device)
        vocab = loaded.tgt_field.vocab
        batch = next(b for b in encode_sources(loaded.src_field, lines, args.batch_size) if not b.empty)
        batch = batch.to(args.device)
        for label, beam in (("greedy", 1), ("beam 5", 5)):
            modes = {mode: search_options(args, beam, mode=mode, stop_every=args.stop_every)
                     for mode in ("dynamic", "static")}
            translators = {mode: Translator(loaded.model, loaded.src_field, loaded.tgt_field, options,
                                            batch_size=args.batch_size, device=args.device, precision=args.precision)
                           for mode, options in modes.items()}
            seconds, outputs = time_settings(translators, lines, args.repeats)
            differ = count_differences(outputs["dynamic"], outputs["static"])["any"]
            for mode, options in modes.items():
                def one_batch():
                    with inference_precision(args.device, args.precision):  # as Translator decodes
                        return beam_search(loaded.model, batch.src, batch.src_lengths, bos=vocab.bos_index,
                                           eos=vocab.eos_index, pad=vocab.pad_index, options=options)
                start = time.perf_counter()
                result = one_batch()
                if args.device.startswith("cuda"):
                    import torch

                    torch.cuda.synchronize(args.device)
                batch_seconds = time.perf_counter() - start
                # the RNN encoder's runs by length read CPU-held lengths (never on accelerators):
                # off while counting, so that the CPU count stands for the accelerator's
                by_length, encoder_module.CPU_RUNS = encoder_module.CPU_RUNS, False
                try:
                    _, syncs = count_host_syncs_on(args.device, one_batch)
                finally:
                    encoder_module.CPU_RUNS = by_length
                rows.append({"mapping": mapping, "search": label, "mode": mode,
                             "sent_per_s": len(lines) / seconds[mode], "ms_per_step": 1000 * batch_seconds / result.steps,
                             "syncs_per_step": syncs / result.steps, "vs_dynamic": seconds["dynamic"] / seconds[mode],
                             "differ": differ})
    return rows


SAMPLING_SETTINGS = (("sample N=1", dict(n_best=1)), ("sample N=4", dict(n_best=4)),
                     ("sample N=4 T=0.7", dict(n_best=4, temperature=0.7)),
                     ("sample N=4 block 3", dict(n_best=4, block_ngram_repeat=3)))
"""The sampling rows: -sample -n_best N (seed 0), with a temperature, with -block_ngram_repeat 3."""


def sampling_rows(checkpoints: dict, lines: list[str], args: argparse.Namespace) -> list[dict]:
    """``-sample`` with the static loop (stopped samples masked: the accelerator loop) and the
    dynamic one (stopped samples leave the batch: ``auto`` on the CPU), interleaved per repeat:
    sentences/s of each and the sentences whose samples differ between them (none expected: the
    noise is keyed by (seed, line, sample, step, token)); then beam 5 with and without
    ``-block_ngram_repeat 3`` (the device's own loop), and how many outputs blocking changed."""
    from nmt.translate.loading import load_model
    from nmt.translate.translator import Translator

    rows = []
    for mapping, path in checkpoints.items():
        loaded = load_model(path, args.device)

        def translator(options):
            return Translator(loaded.model, loaded.src_field, loaded.tgt_field, options, batch_size=args.batch_size,
                              device=args.device, precision=args.precision)

        for label, fields in SAMPLING_SETTINGS:
            modes = {mode: search_options(args, 1, sample=True, mode=mode, stop_every=args.stop_every, **fields)
                     for mode in ("static", "dynamic")}
            seconds, outputs = time_settings({mode: translator(o) for mode, o in modes.items()}, lines, args.repeats)
            differ = count_differences(outputs["static"], outputs["dynamic"])
            rows.append({"mapping": mapping, "setting": label,
                         "sent_per_s_static": len(lines) / seconds["static"],
                         "sent_per_s_dynamic": len(lines) / seconds["dynamic"],
                         "dynamic_speedup": seconds["static"] / seconds["dynamic"],
                         "differ": differ["hypotheses"], "max_score_diff": differ["max_score_diff"]})
        settings = {"beam 5": search_options(args, 5), "beam 5 block 3": search_options(args, 5, block_ngram_repeat=3)}
        seconds, outputs = time_settings({k: translator(o) for k, o in settings.items()}, lines, args.repeats)
        changed = count_differences(outputs["beam 5"], outputs["beam 5 block 3"])["hypotheses"]
        for label in settings:
            rows.append({"mapping": mapping, "setting": label, "sent_per_s": len(lines) / seconds[label],
                         "outputs_changed_by_blocking": changed})
    return rows


def count_differences(a: list, b: list) -> dict:
    """Sentences whose translations differ between two runs: in their hypotheses' texts (the
    n-best list in order), in their certificates (exact flag or reason), in ``n_nonzero``, and in
    any of these; ``max_score_diff``: the largest difference of a hypothesis' log-probability
    where the texts agree (float rounding: batch shapes and devices sum in other orders)."""
    keys = {"hypotheses": lambda t: [text for text, _ in t.hypotheses], "certificate": lambda t: (t.exact, t.reason),
            "n_nonzero": lambda t: t.n_nonzero}
    out: dict = {name: sum(key(x) != key(y) for x, y in zip(a, b)) for name, key in keys.items()}
    out["any"] = sum(any(key(x) != key(y) for key in keys.values()) for x, y in zip(a, b))
    out["max_score_diff"] = max((abs(sx - sy) for x, y in zip(a, b) if keys["hypotheses"](x) == keys["hypotheses"](y)
                                 for (_, sx), (_, sy) in zip(x.hypotheses, y.hypotheses)), default=0.0)
    return out


def default_batching_rows(checkpoints: dict, lines: list[str], args: argparse.Namespace) -> list[dict]:
    """nmt-translate's defaults for the device (its batching, certificates and statistics on):
    sentences/s (best of ``--repeats``), and with ``--compare-cpu`` the sentences whose outputs
    or certificates differ from the same search on the CPU."""
    from nmt.translate.loading import load_model
    from nmt.translate.translator import Translator, default_batching

    batch_size, batch_type = default_batching(args.device)
    rows = []
    for mapping, path in checkpoints.items():
        loaded = load_model(path, args.device)
        cpu = load_model(path, "cpu") if args.compare_cpu else None
        for label, beam in (("greedy", 1), ("beam 5", 5)):
            options = search_options(args, beam)
            translator = Translator(loaded.model, loaded.src_field, loaded.tgt_field, options, batch_size=batch_size,
                                    batch_type=batch_type, device=args.device, precision=args.precision)
            seconds, outputs = time_settings({"default": translator}, lines, args.repeats)
            row = {"mapping": mapping, "search": label, "batch": f"{batch_size} {batch_type}",
                   "sent_per_s": len(lines) / seconds["default"]}
            if cpu is not None:
                cpu_batch, cpu_type = default_batching("cpu")
                reference = Translator(cpu.model, cpu.src_field, cpu.tgt_field, options, batch_size=cpu_batch,
                                       batch_type=cpu_type, device="cpu").translate(lines)
                row["vs_cpu"] = count_differences(outputs["default"], reference)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 training steps, 48 sentences, max_length 30")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="MAPPING=PATH")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR,
                        help="Multi30k files (recipes/translation/prepare.py multi30k writes them)")
    parser.add_argument("--src", type=Path, default=None, help="source sentences (default: DATA_DIR/test_2016_flickr.de)")
    parser.add_argument("--sentences", type=int, help="use the first N sentences (default: all; quick: 48)")
    parser.add_argument("--train_steps", type=int, default=400, help="training steps per model without --checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--max_length", type=int, default=100)
    parser.add_argument("--max_length_ratio", type=float, default=0.0,
                        help="per-sentence limit of every search (nmt-translate -max_length_ratio; 0: max_length alone)")
    parser.add_argument("--model", choices=tuple(CONFIGS), default="lstm",
                        help="the architecture trained without --checkpoint (default: the LSTM)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per setting (best of)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--work", type=Path, help="keep trained models here and reuse them (default: temporary)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16", "int8"),
                        help="int8: the CPU's int8 products (nmt-translate -precision int8)")
    parser.add_argument("--compare-cpu", action=argparse.BooleanOptionalAction, default=None,
                        help="also translate on the CPU and count the sentences whose outputs or certificates "
                             "differ (default: on with --device cuda)")
    parser.add_argument("--stop_every", type=int, default=4, help="static search: stop flag read every K steps")
    parser.add_argument("--tables", default="search,modes,default,sampling,startup",
                        help="comma-separated tables to run: search (certificate costs), modes (search loops), "
                             "default (nmt-translate's defaults), sampling (-sample loops and a blocking row), startup")
    parser.add_argument("--only-given", action="store_true",
                        help="time the --checkpoint models only (any labels), training none")
    parser.add_argument("--load", default=None, help="label printed with the figures, e.g. 'idle' or "
                        "'loaded: 8 jobs on 2 cores' (figures under load are not speed claims)")
    args = parser.parse_args()
    if args.compare_cpu is None:
        args.compare_cpu = not str(args.device).startswith("cpu")
    if args.quick:
        args.train_steps, args.repeats, args.max_length = 5, 1, 30
        args.sentences = args.sentences or 48

    import torch

    from nmt.data.textfiles import read_lines
    from nmt.utils.allocator import keep_freed_memory
    from nmt.utils.device import make_current
    from nmt.utils.io import atomic_write_text
    from nmt.translate.loading import load_model
    from nmt.translate.translator import Translator, TranslationSummary

    keep_freed_memory()  # as nmt-translate does
    make_current(args.device)  # as nmt-translate does: synchronize() below waits for that device
    torch.set_num_threads(args.threads)
    args.src = args.src or args.data_dir / "test_2016_flickr.de"
    if not args.src.is_file():
        raise SystemExit(f"bench_translate: {args.src}: no such file (give --src)")
    lines = [line for line in read_lines(args.src)]
    lines = lines[: args.sentences] if args.sentences else lines
    tables = set(args.tables.split(","))
    unknown = tables - {"search", "modes", "default", "sampling", "startup"}
    if unknown:
        raise SystemExit(f"bench_translate: --tables: unknown {', '.join(sorted(unknown))}")
    needed = set() if args.only_given else {"softmax", "entmax15"} - {item.split("=", 1)[0] for item in args.checkpoint}
    for name in ("train.de", "train.en", "val.de", "val.en") if needed else ():
        if not (args.data_dir / name).is_file():  # the models to train read them
            raise SystemExit(f"bench_translate: {args.data_dir / name}: no such file (give --data-dir, "
                             f"or --checkpoint softmax=PATH and entmax15=PATH)")

    with tempfile.TemporaryDirectory(prefix="bench_translate_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        checkpoints = dict(item.split("=", 1) for item in args.checkpoint)
        for mapping in ("softmax", "entmax15"):
            if mapping in needed and mapping not in checkpoints:
                checkpoints[mapping] = str(train_model(mapping, work, args.train_steps, 32 if args.quick else None,
                                                       args.data_dir, args.model))
            torch.set_num_threads(args.threads)  # training may have changed it
        rows, figures = [], {"sentences": len(lines), "threads": args.threads, "batch_size": args.batch_size,
                             "machine": platform.processor() or platform.machine(), "results": []}
        for mapping, path in checkpoints.items() if "search" in tables else ():
            loaded = load_model(path, args.device)
            for label, beam in (("greedy", 1), ("beam 5", 5)):
                # (certificate, support statistics): both = the nmt-translate default
                options = search_options(args, beam)
                translators = {setting: Translator(loaded.model, loaded.src_field, loaded.tgt_field,
                                                   options.updated(certify=setting[0], support_stats=setting[1]),
                                                   batch_size=args.batch_size, device=args.device,
                                                   precision=args.precision)
                               for setting in ((True, True), (True, False), (False, False))}
                seconds, outputs = time_settings(translators, lines, args.repeats)
                speeds = {setting: len(lines) / secs for setting, secs in seconds.items()}
                summary = TranslationSummary.of(outputs[True, True])
                full, cert_only, bare = speeds[True, True], speeds[True, False], speeds[False, False]
                result = {"mapping": mapping, "search": label, "sent_per_s": full,
                          "sent_per_s_certificate_only": cert_only, "sent_per_s_no_certificate": bare,
                          "certificate_overhead_percent": 100.0 * (bare / cert_only - 1.0),
                          "certificate_and_stats_overhead_percent": 100.0 * (bare / full - 1.0),
                          "certified_percent": summary.certified_percent, "mean_support": summary.mean_support}
                figures["results"].append(result)
                rows.append(result)
        figures["search_modes"] = search_mode_rows(checkpoints, lines, args) if "modes" in tables else []
        figures["default_batching"] = default_batching_rows(checkpoints, lines, args) if "default" in tables else []
        figures["sampling"] = sampling_rows(checkpoints, lines, args) if "sampling" in tables else []
        if "startup" in tables:
            figures["startup_seconds"] = startup_seconds(Path(next(iter(checkpoints.values()))) if args.only_given
                                                         else Path(checkpoints["entmax15"]), 1 if args.quick else 3)

    models = "checkpoints" if len(args.checkpoint) == 2 else f"{args.model}, {args.train_steps} steps"
    print(f"{len(lines)} sentences ({models}), batch {args.batch_size}, {args.threads} threads, "
          f"max_length {args.max_length}" + (f", max_length_ratio {args.max_length_ratio}" if args.max_length_ratio else "")
          + ", "
          f"device {args.device}, precision {args.precision}" + (f"; load: {args.load}" if args.load else ""))
    if rows:
        print("sent/s: default (certificate + support statistics); cert: certificate only; bare: neither")
        print(f"{'output':10s} {'search':8s} {'sent/s':>8s} {'cert':>8s} {'bare':>8s} {'cert cost':>9s} "
              f"{'all cost':>9s} {'certified':>9s} {'support':>8s}")
        for r in rows:
            support = "n/a" if r["mean_support"] is None else f"{r['mean_support']:.2f}"
            print(f"{r['mapping']:10s} {r['search']:8s} {r['sent_per_s']:8.1f} {r['sent_per_s_certificate_only']:8.1f} "
                  f"{r['sent_per_s_no_certificate']:8.1f} {r['certificate_overhead_percent']:8.1f}% "
                  f"{r['certificate_and_stats_overhead_percent']:8.1f}% {r['certified_percent']:8.1f}% {support:>8s}")
    if "startup_seconds" in figures:
        print(f"start-up (fresh interpreter, imports + model load): {figures['startup_seconds']:.2f} s")
    if figures["search_modes"]:
        print(f"search loops (certificate on; static reads its stop flag every {args.stop_every} steps; ms and syncs "
              "per step of one batch; on the CPU the syncs include CPU-only paths' host reads)")
        print(f"{'output':10s} {'search':8s} {'loop':8s} {'sent/s':>8s} {'ms/step':>8s} {'syncs/step':>10s} "
              f"{'vs dynamic':>10s} {'differ':>10s}")
        for r in figures["search_modes"]:
            print(f"{r['mapping']:10s} {r['search']:8s} {r['mode']:8s} {r['sent_per_s']:8.1f} {r['ms_per_step']:8.2f} "
                  f"{r['syncs_per_step']:10.2f} {r['vs_dynamic']:9.2f}x {r['differ']:>5d}/{len(lines)}")
    if figures["default_batching"]:
        print(f"nmt-translate's default options on {args.device} (certificate and statistics on)"
              + ("; sentences differing from the CPU: in hypothesis texts / certificates / n_nonzero / any"
                 if args.compare_cpu else ""))
        for r in figures["default_batching"]:
            vs = r.get("vs_cpu")
            cmp = "" if vs is None else (f"   vs CPU {vs['hypotheses']}/{vs['certificate']}/{vs['n_nonzero']}/"
                                         f"{vs['any']} of {len(lines)}, scores within {vs['max_score_diff']:.1e}")
            print(f"{r['mapping']:10s} {r['search']:8s} batch {r['batch']:16s} {r['sent_per_s']:8.1f} sent/s{cmp}")
    if figures["sampling"]:
        print(f"-sample (seed 0): static loop (stopped samples masked) vs dynamic (stopped samples leave the batch; "
              f"auto on the CPU); differ: sentences whose samples differ between the loops")
        for r in figures["sampling"]:
            if "sent_per_s_static" in r:
                print(f"{r['mapping']:10s} {r['setting']:20s} static {r['sent_per_s_static']:8.1f} dynamic "
                      f"{r['sent_per_s_dynamic']:8.1f} sent/s ({r['dynamic_speedup']:.2f}x)  differ "
                      f"{r['differ']}/{len(lines)}, scores within {r['max_score_diff']:.1e}")
            else:
                print(f"{r['mapping']:10s} {r['setting']:20s} {r['sent_per_s']:8.1f} sent/s  (outputs changed by "
                      f"blocking: {r['outputs_changed_by_blocking']}/{len(lines)})")
    if args.json:
        atomic_write_text(args.json, json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
