#!/usr/bin/env bash
# Run the test suite and the GPU benchmarks on a CUDA machine, one stage after another.
#
#   bash tools/gpu_check.sh [STAGE ...]     # stages: env launch tests tests_cuda tests_rest sparse sparse_graphs
#                                         train train_compile transformer transformer_unfused translate
#                                         translate_torch_search translate_transformer
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
#
# Stage times on one H200 (2026-11-26; plan a lease of 15 device minutes, a start included, by them):
# env 6 s; launch (host microseconds per call, layer by layer: tools/bench_launch.py, with Triton's
# own launch path and with nmt's launch cache) about 40 s (not yet timed on a GPU); tests (the whole suite) was cut at
# 140-170 s on the H200, 15 workers, with about 16 tests left: 400 s now; tests_cuda not yet timed; sparse 69 s;
# sparse_graphs (the mappings and losses as CUDA-graph replays: the kernels alone, as a compiled
# step runs them; not in the default list) not yet timed, about as long; train_compile 87 s
# (112 s with --profile 3); translate more than 110 s (two models trained in 19 s each, then the CPU
# comparison): give it its default 240 s; translate_transformer (the Multi30k Transformer recipe's
# model trained 1,000 steps per output mapping, then the same tables with -max_length_ratio 1.25; not
# in the default list) not yet timed, 300 s allowed; transformer (the Transformer's training rows, its
# softmax heads fused where their probabilities are not read) and transformer_unfused (the softmax row
# with NMT_FUSED_ATTENTION=0: the A/B of the fused heads) not yet timed; translate_torch_search (after
# translate, whose models it reuses: the search step's candidates and bookkeeping by torch's operations,
# NMT_TRITON_CANDIDATES=0 NMT_TRITON_STEP=0 NMT_TRITON_MASK=0, the A/B of the search's three kernels) not yet timed
# (estimated 50-170 s: 240 s allowed, as for translate, which took more than 110 s).
# The first call of a lease starts the machine (about 30 s).
# train_compile runs with TORCH_LOGS=perf_hints,cudagraphs: inductor says there when (and why) it skips CUDA graphs;
# bench_train also counts the skips per row, and with --profile prints where the host time goes
# (the phases twice: the backward on autograd's device thread, then on the calling thread).
# training.compile_encoder (the LSTM encoder inside the compiled graph, one graph per step) is timed
# by a second train_compile call, with a longer limit (it compiled 2.5x slower on the CPU):
# GPU_CHECK_TRAIN_ARGS="--compile-encoder" GPU_CHECK_TRAIN_COMPILE_S=420 bash tools/gpu_check.sh train_compile
# bench_train compiles each compiled row afresh (a dynamo reset: no row runs another row's graphs) and
# prints the graphs it compiled; "vs softmax" of a compiled row is against the compiled softmax row.
# A device call may run 10 minutes at most (and only 8 files come back from $OUT), so a lease of 15
# device minutes is best spent in two (carry data/multi30k, prepared here, and .whl/):
#   OUT=$OUT GPU_CHECK_WORKERS=15 bash tools/gpu_check.sh env tests_cuda sparse train_compile translate  # about 8 min
#   OUT=$OUT GPU_CHECK_WORKERS=15 bash tools/gpu_check.sh tests_rest translate_torch_search launch       # the rest
# Unmeasured since 2026-11-27 (planned by an audit of the stages; each call at most 10 minutes):
#   OUT=$OUT GPU_CHECK_WORKERS=15 GPU_CHECK_TRAIN_ARGS="--profile 3" GPU_CHECK_TESTS_REST_S=300 \
#       bash tools/gpu_check.sh env train_compile launch tests_rest
# (launch: a real Triton launch's host cost next to a torch operation's, with its tensors handed to
# the launcher as pointers and as tensors; on the CPU's stand-in the eager 1.5-entmax step now takes
# 0.90-0.97x softmax's host time, where the H200 measured 1.22x its step time: see BENCHMARKS.md,
# 2026-11-27, a thirteenth session)
#   OUT=$OUT bash tools/gpu_check.sh translate translate_torch_search transformer transformer_unfused
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
        launch) stage launch 90 bash -c "NMT_TRITON_LAUNCH_CACHE=0 $PY tools/bench_launch.py --device cuda; \
              $PY tools/bench_launch.py --device cuda" ;;  # Triton's own launch, then nmt's launch cache
        sparse) stage sparse 120 $PY tools/bench_sparse.py --device cuda ${GPU_CHECK_SPARSE_ARGS:-} ;;
        sparse_graphs) stage sparse_graphs 120 $PY tools/bench_sparse.py --device cuda --graphs --dtypes float32 ;;
        train) stage train 100 $PY tools/bench_train.py --device cuda --steps 100 --warmup 30 ${GPU_CHECK_TRAIN_ARGS:-} \
              --only "softmax / softmax" "entmax15 / entmax15" "softmax / entmax15" "entmax15 / softmax" ;;
        train_compile) stage train_compile 240 env TORCH_LOGS="${TORCH_LOGS:-perf_hints,cudagraphs}" $PY tools/bench_train.py --device cuda --steps 60 --warmup 10 \
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
        translate_transformer) stage translate_transformer 300 $PY tools/bench_translate.py --device cuda --model transformer \
              --train_steps 1000 --max_length_ratio 1.25 --work runs/gpu_models --repeats 3 ${GPU_CHECK_TRANSLATE_ARGS:-} ;;
        *) echo "unknown stage $s (env launch tests sparse sparse_graphs train train_compile transformer" \
                "transformer_unfused translate translate_torch_search translate_transformer)"; exit 2 ;;
    esac
done
