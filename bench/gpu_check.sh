#!/usr/bin/env bash
# The GPU checks, in one go: for each --pos, the GPT-2 124M model (configs/gpt2_124m.toml) trained a few steps
# with torch.compile and bf16 on one GPU, reporting ms/iter and MFU from train.py's own log; then the KV-cache
# generation benchmark. Results go to $OUT (default /tmp/gpu_check): env.txt, train_<pos>.log, summary.txt.
#
# Data: the BPE Shakespeare stands in for FineWeb-Edu (same tokenizer and vocabulary, no download). Prepare it
# first with `python data/shakespeare/prepare.py`; on a machine without internet bring data/shakespeare along.
#
#     OUT=/tmp/gpu_check bash bench/gpu_check.sh
#
# Budget: about 1-1.5 minutes per scheme on an H200 (most of it compiling), ~7 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} > "$OUT/env.txt" 2>&1

if [ ! -f data/shakespeare/val.bin ]; then
    echo "data/shakespeare is not prepared: run python data/shakespeare/prepare.py first" | tee "$OUT/summary.txt"
    exit 1
fi

# 16 sequences x 1024 tokens x 4 micro-batches = 65,536 tokens per step: enough to time a step, short to run.
# One evaluation batch at step 0 and at the end keeps evaluation (and its extra compile) small.
for pos in learned sinusoidal rope alibi none; do
    timeout 150 python3 train.py --config configs/gpt2_124m.toml --dataset=shakespeare --pos="$pos" \
        --grad_accum=4 --max_iters=30 --warmup_iters=10 --lr_decay_iters=30 --log_interval=5 \
        --eval_interval=1000 --eval_iters=1 --out_dir="/tmp/gpu_check_$pos" > "$OUT/train_$pos.log" 2>&1
    echo "$pos (exit $?): $(grep 'ms/iter' "$OUT/train_$pos.log" | tail -1)" >> "$OUT/summary.txt"
done

timeout 120 python3 bench/generation.py --repeats=3 --device=cuda >> "$OUT/summary.txt" 2>&1
cat "$OUT/env.txt" "$OUT/summary.txt"
