#!/usr/bin/env bash
# Run the test suite and the GPU benchmarks on a CUDA machine, one stage after another.
#
#   bash tools/gpu_check.sh [STAGE ...]     # stages: env launch tests tests_cuda tests_rest sparse sparse_graphs
#                                         train train_compile transformer transformer_unfused translate
#                                         translate_torch_search translate_transformer optimizers
#                                         (default: env tests_cuda sparse train_compile translate, about
#                                         8 minutes on an H200: one call of a 15-minute lease)
# tests runs the whole suite; tests_cuda only the tests marked `cuda` (tests/conftest.py: every test
# skipped without CUDA, the Triton kernels' module and the CUDA-graph benchmark's smoke test), the
# ones a CPU never runs, so that they run first; tests_rest the others (on a GPU machine they take
# the GPU where they build trainers with `device: auto`).
#
# Every stage has its own time limit (GPU_CHECK_<STAGE>_S, seconds) and writes its full log to
# $OUT/<stage>.log (default OUT=runs/gpu_check), so a stage that hangs or fails leaves the others'
# figures. Needs the Multi30k files in data/multi30k (recipes/translation/prepare.py multi30k) for
# the train and translate stages, and the test extras (pytest, hypothesis, scipy, entmax). Wheels in
# .whl/ (a machine without a package index; the workplace's GPU machines lack entmax, subword-nmt
# and mock) are installed first. GPU_CHECK_TRAIN_ARGS adds options to
# the training stages (e.g. "--profile 3": host sync sites and the kernels per step), GPU_CHECK_TESTS
# selects tests, GPU_CHECK_SPARSE_ARGS and GPU_CHECK_TRANSLATE_ARGS those benchmarks' options.
# Guided alignment's cost on a GPU (its supervised softmax heads leave the fused attention kernel;
# unmeasured): GPU_CHECK_TRAIN_ARGS="--guided-alignment 0.05" adds a guided row after each training row;
# with "--transformer --guided-alignment 0.05 --full-context-alignment" the Transformer's guided rows run
# the second (full-context) decoder pass too (0.72-0.82x the plain update on the CPU; unmeasured on a GPU).
# tests_cuda now also holds the tensor-alpha loss (tests/sparse/test_cuda.py), the learned-alpha guided
# update and the full-context -report_align on CUDA (written 2026-11-29 without a device: never run yet),
# and whole-word dropout on CUDA under the sync detector (tests/models/test_word_dropout.py; 2026-11-29, a
# thirty-first session, never run yet). Source noise (data.train[i].noise) runs on the host batch before it
# is copied: 0.30 ms a batch of 64 Multi30k sentences on one CPU thread; its share of a GPU step unmeasured.
# Copying outputs (model.output.copy; 2026-11-29, a thirty-second session, never run yet): tests_cuda holds
# their loss, gradients and steps on CUDA against the CPU under the sync detector
# (tests/models/test_copy_attention.py); their cost in a GPU training step and search is unmeasured, as is
# coverage attention's (model.attention.coverage: one more (N, L) state tensor a step) and the coverage loss's.
# Optimizers (2026-11-29, a thirty-third session, never run yet): tests_cuda holds nmt's Adafactor on CUDA
# against the CPU under the sync detector (tests/train/test_adafactor.py); the optimizers stage times a step
# of adam / adamw / sgd / adafactor / torch's Adafactor (whose 3 host reads per tensor the CPU only counts).
# nmt-translate under torchrun on several GPUs (nmt/cli/translate_ranks.py; CPU processes tested) unmeasured:
#   torchrun --nproc_per_node=2 -m nmt.cli.translate -model M -src data/multi30k/test_2016_flickr.de -output o.en
#
# Measured on 2026-11-29 (a thirty-eighth session, one H200, code of 7316b1a): env tests_cuda sparse train_compile in
# one call (392 s: tests_cuda 121 s, 194 passed, 9 failed; sparse 169 s, whole; train_compile 90 s without --profile).
# The nine failures were in tests never run before (host copies inside the sync detector, host tensors in CUDA
# arithmetic, an old unpacking) and are fixed in the tests; the second call was refused (loans paused), so these
# have not run again on a GPU yet -- first in the next lease:
#   GPU_CHECK_TESTS="-m cuda tests/sparse/test_cuda.py tests/models/test_copy_attention.py tests/train/test_adafactor.py
#       tests/translate/test_target_prefix.py tests/sparse/test_triton_launch.py tests/translate/test_constraints.py"
#       bash tools/gpu_check.sh tests                              # about 60 s with 15 workers
# Everything listed below as unmeasured is still unmeasured, except the default stages' sparse and train_compile
# tables (BENCHMARKS.md, "GPU again", thirty-eighth session). Two leads of that run to settle with sparse_graphs
# and launch: bfloat16 entmax_bisect(alpha/head) forward+backward 4.8-5.9x softmax (float32 1.9-2.9x), and
# cross_entropy's eager backward 0.23 ms at (1024, 8000) against sparsemax's 0.13 (one Triton launch each).
# Since then (same session, CPU): a compiled constrained search under torch 2.11 (its state was a NamedTuple
# _replace, empty under 2.11's dynamo; fixed): tests/translate/test_constraints.py's compile tests cover it.
# Stage times on one H200 (2026-11-27, a nineteenth session; plan a lease of 15 device minutes, a start
# included, by them): env 6 s; tests_cuda 65 s (172 tests, 15 workers); sparse more than 100 s (cut
# there before its last table, the (4096, 32000) losses: give it its default 180 s); sparse_graphs
# (the mappings and losses as CUDA-graph replays: the kernels alone, as a compiled step runs them;
# float32, no entmax-package column; not in the default list) 26 s; train_compile about 130 s with
# --profile 3; launch more than 60 s (cut in its second half: default 150 s); translate 165 s (two
# models trained in 17-20 s each, then the CPU comparison). Earlier: the whole suite (tests) cut at
# 140-170 s with about 16 tests left (400 s allowed now); tests/train and tests/cli alone did not end
# in 76 s (152 passed, none failed). Not yet timed: tests_rest, translate_transformer (300 s
# allowed: the Multi30k Transformer recipe's model trained 1,000 steps per output mapping, then the
# same tables with -max_length_ratio 1.25), transformer (the Transformer's training rows, its
# softmax heads fused where their probabilities are not read), transformer_unfused (the softmax row
# with NMT_FUSED_ATTENTION=0: the A/B of the fused heads), translate_torch_search (after translate,
# whose models it reuses: the search step's candidates and bookkeeping by torch's operations,
# NMT_TRITON_CANDIDATES=0 NMT_TRITON_STEP=0 NMT_TRITON_MASK=0, the A/B of the search's three kernels;
# estimated 50-170 s: 240 s allowed).
# The first call of a lease starts the machine (about 30 s).
# train_compile runs with TORCH_LOGS=perf_hints,cudagraphs: inductor says there when (and why) it skips CUDA graphs;
# bench_train also counts the skips per row, and with --profile prints where the host time goes
# (the phases twice: the backward on autograd's device thread, then on the calling thread).
# training.compile_encoder (the LSTM encoder inside the compiled graph, one graph per step) is timed
# by a second train_compile call, with a longer limit (it compiled 2.5x slower on the CPU):
# GPU_CHECK_TRAIN_ARGS="--compile-encoder" GPU_CHECK_TRAIN_COMPILE_S=420 bash tools/gpu_check.sh train_compile
# bench_train compiles each compiled row afresh (a dynamo reset: no row runs another row's graphs) and
# prints the graphs it compiled; "vs softmax" of a compiled row is against the compiled softmax row.
# A device call may run 10 minutes at most (and only 8 files come back from $OUT), and a machine stays
# warm 30 s after a call: a lease of 15 device minutes is best spent in two calls, the second issued
# at once (carry data/multi30k, prepared here, and .whl/). Measured on 2026-11-27 (nineteenth session):
# env tests_cuda sparse train_compile launch translate (533 s), then sparse_graphs and part of the rest
# of the suite. Unmeasured since, in order of what they settle:
#   OUT=$OUT GPU_CHECK_WORKERS=15 GPU_CHECK_TRAIN_ARGS="--profile 3" GPU_CHECK_TRAIN_S=150 \
#       bash tools/gpu_check.sh env train launch                  # where the eager 1.5-entmax step's host time goes
#   OUT=$OUT GPU_CHECK_TRAIN_ARGS="--repeats 3" GPU_CHECK_TRAIN_S=200 bash tools/gpu_check.sh train
#       # rows in rounds: whether the 1.5-entmax row's 15-25% slower common operations were its turn
#   OUT=$OUT GPU_CHECK_TRAIN_ARGS="--compile-encoder" GPU_CHECK_TRAIN_COMPILE_S=420 bash tools/gpu_check.sh train_compile
#   OUT=$OUT GPU_CHECK_WORKERS=15 GPU_CHECK_TESTS_REST_S=400 bash tools/gpu_check.sh tests_rest
#   OUT=$OUT bash tools/gpu_check.sh translate translate_torch_search transformer transformer_unfused
# Since the twentieth session (2026-11-27, no device) also unmeasured: the eager rows of sparse and launch
# after the CUDA route's operator cuts (tools/host_ops.py: every mapping now dispatches softmax's operator
# count, the losses one or two more than F.cross_entropy's; learned alphas 29 -> 7 operators): the default
# stages' sparse and launch tables settle it; the CUDA tests of sampling and n-gram blocking (in tests_cuda);
# fp16 training's one host read per update (the GradScaler's overflow flag: train with --precision fp16).
# Since the twenty-first session (2026-11-28, no device) also unmeasured: training.ema with CUDA graphs
# (the in-place swap keeps the parameter tensors, so no recapture is expected; its CUDA step is in the
# sync audit on CPU only), and nmt-translate -report_align / -replace_unk in the static search loop on CUDA.
# The twenty-second session (2026-11-28, no device) wrote their CUDA tests, never run yet (they run in
# tests_cuda; alone: GPU_CHECK_TESTS="-m cuda tests/train/test_ema.py tests/translate/test_translate_alignment.py"
# bash tools/gpu_check.sh tests): tests/train/test_ema.py::test_cuda_graphs_average_equals_eager_and_the_swap_records_no_graph
# (mode reduce-overhead with the average: the average against the closed form and eager CUDA, and the same
# CUDA-graph recordings (CUDAGraphTreeManager.record_function) and dynamo graphs as without it) and
# tests/translate/test_translate_alignment.py::test_cuda_static_loop_aligns_and_replaces_unknowns_as_the_cpu
# (float64 models: texts, scores, alignments of both modes and levels, <unk> replaced, as the CPU's).
# (train: the eager rows, whose --profile failed on the H200 before the fix of 2026-11-27; the
# compiled 1.5-entmax step was 0.80x softmax's there, host-bound: the GPU busy 3.6 of its 17.7 ms,
# and timed after the softmax row's profile, which may have slowed it: --profile now profiles in a
# second pass after every row was timed, rebuilding and recompiling each row, so give
# train_compile with --profile about 200 s)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    # into the interpreter's own site-packages (the tests' subprocesses set PYTHONPATH themselves);
    # where that is not allowed, into /tmp/site on PYTHONPATH
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>/dev/null \
        || { $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
             .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}; }
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
STAGES=${*:-env tests_cuda sparse train_compile translate}  # train_compile has the eager rows too
WORKERS=${GPU_CHECK_WORKERS:-$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))}

stage() {  # stage NAME DEFAULT_SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local var="GPU_CHECK_${name^^}_S"
    limit=${!var:-$limit}
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
}

for s in $STAGES; do
    case $s in
        env) stage env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
              $PY -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name()); import triton; print(\"triton\", triton.__version__)'" ;;
        tests) stage tests 400 $PY -m pytest -q -p no:cacheprovider -n "$WORKERS" -rfE --durations=5 ${GPU_CHECK_TESTS:-} ;;
        tests_cuda) stage tests_cuda 240 $PY -m pytest -q -p no:cacheprovider -n "$WORKERS" -rfE --durations=5 -m cuda ;;
        tests_rest) stage tests_rest 400 $PY -m pytest -q -p no:cacheprovider -n "$WORKERS" -rfE --durations=5 -m "not cuda" ;;
        launch) stage launch 150 bash -c "NMT_TRITON_LAUNCH_CACHE=0 $PY tools/bench_launch.py --device cuda; \
              $PY tools/bench_launch.py --device cuda" ;;  # Triton's own launch, then nmt's launch cache
        sparse) stage sparse 180 $PY tools/bench_sparse.py --device cuda ${GPU_CHECK_SPARSE_ARGS:-} ;;
        sparse_graphs) stage sparse_graphs 120 $PY tools/bench_sparse.py --device cuda --graphs --dtypes float32 ;;
        train) stage train 100 $PY tools/bench_train.py --device cuda --steps 100 --warmup 30 ${GPU_CHECK_TRAIN_ARGS:-} \
              --only "softmax / softmax" "entmax15 / entmax15" "softmax / entmax15" "entmax15 / softmax" ;;
        train_compile) stage train_compile 300 env TORCH_LOGS="${TORCH_LOGS:-perf_hints,cudagraphs}" $PY tools/bench_train.py --device cuda --steps 60 --warmup 10 \
              --compile --max-shapes 1 ${GPU_CHECK_TRAIN_ARGS:-} --only "softmax / softmax" "entmax15 / entmax15" ;;
        transformer) stage transformer 150 $PY tools/bench_train.py --device cuda --steps 100 --warmup 30 \
              --transformer --only "transformer: softmax / softmax" "transformer: entmax15 / softmax" \
              "transformer: adaptive / softmax" ;;
        transformer_unfused) stage transformer_unfused 90 env NMT_FUSED_ATTENTION=0 $PY tools/bench_train.py --device cuda \
              --steps 100 --warmup 30 --transformer --only "transformer: softmax / softmax" ;;  # the A/B of fused heads
        translate) stage translate 240 $PY tools/bench_translate.py --device cuda --work runs/gpu_models --repeats 3 \
              ${GPU_CHECK_TRANSLATE_ARGS:-} ;;
        translate_torch_search) stage translate_torch_search 240 env NMT_TRITON_CANDIDATES=0 NMT_TRITON_STEP=0 NMT_TRITON_MASK=0 \
              $PY tools/bench_translate.py --device cuda --work runs/gpu_models --repeats 3 --no-compare-cpu \
              ${GPU_CHECK_TRANSLATE_ARGS:-} ;;  # the A/B of the search step's kernels
        optimizers) stage optimizers 90 $PY tools/bench_optimizers.py --device cuda ;;  # step ms, state MB, syncs
        translate_transformer) stage translate_transformer 300 $PY tools/bench_translate.py --device cuda --model transformer \
              --train_steps 1000 --max_length_ratio 1.25 --work runs/gpu_models --repeats 3 ${GPU_CHECK_TRANSLATE_ARGS:-} ;;
        *) echo "unknown stage $s (env launch tests sparse sparse_graphs train train_compile transformer" \
                "transformer_unfused translate translate_torch_search translate_transformer optimizers)"; exit 2 ;;
    esac
done
