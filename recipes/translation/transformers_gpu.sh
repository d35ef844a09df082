#!/usr/bin/env bash
# The Multi30k Transformer recipes side by side on one GPU, the same number of updates each, then
# test_2016_flickr BLEU / chrF (beam 5) and the learned alphas. Run from the project root after
#   python recipes/translation/prepare.py multi30k
# usage: bash recipes/translation/transformers_gpu.sh [UPDATES (5000)] [MAX_MINUTES (30)]
# Logs and checkpoints: runs/transformers_gpu/<run>/ (OUT=... to change).
set -uo pipefail
STEPS=${1:-5000}; MIN=${2:-30}
OUT=${OUT:-runs/transformers_gpu}
R=recipes/translation/configs
mkdir -p "$OUT"
declare -A CFG=([softmax]=$R/multi30k_transformer_softmax.yaml [entmax15]=$R/multi30k_transformer_entmax15.yaml
                [adaptive15]=$R/multi30k_transformer_adaptive.yaml [adaptive11]=$R/multi30k_transformer_adaptive.yaml)
RUNS="softmax entmax15 adaptive15 adaptive11"
for name in $RUNS; do
  extra=""; [ "$name" = adaptive11 ] && extra="model.attention.params.alpha_init=1.1"
  python3 -m nmt.cli.train -config "${CFG[$name]}" -quiet -set training.device=cuda training.threads=3 \
     training.max_steps="$STEPS" training.max_minutes="$MIN" training.save_dir="$OUT/$name" $extra \
     > "$OUT/train_$name.log" 2>&1 &
done
wait
for name in $RUNS; do
  tail -n 1 "$OUT/train_$name.log"
  python3 -m nmt.cli.translate -model "$OUT/$name/best.pt" -src data/multi30k/test_2016_flickr.de \
     -tgt data/multi30k/test_2016_flickr.en -beam_size 5 -device cuda -output "$OUT/$name/test.hyp" \
     2> "$OUT/$name/translate.err"
  echo "== $name"; tail -n 2 "$OUT/$name/translate.err"
done
for name in adaptive15 adaptive11; do
  python3 -c "
from nmt.translate.loading import load_model
for kind, a in load_model('$OUT/$name/best.pt', 'cpu').model.learned_alphas().items():
    print('$name', kind, [[round(x, 3) for x in row] for row in a.tolist()])"
done
