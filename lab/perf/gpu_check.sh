#!/usr/bin/env bash
# The GPU checks in one call of at most 8 minutes (the timeouts below add up to 470 s), on one GPU:
#   1. generation, greedy, 1,024 new tokens, every scheme, eager KV cache against the CUDA graph ("same tokens"
#      checks one against the other), at the shakespeare_char recipe's shape (10.7M) and at GPT-2 124M; the
#      operators a decode step launches, a column of the same table.
#   2. compiled decoding (the compiled step captured as one CUDA graph), every scheme at the recipe's shape and
#      rope at 124M, under TORCH_LOGS=perf_hints,cudagraphs: summary.txt counts "skipping cudagraphs" lines.
#   3. python train.py --pos=rope, then python sample.py, as a user types them (train.py gets SIGTERM at its
#      timeout, saves and stops, so sample.py has a checkpoint either way); then sample.py on an untrained
#      model of the recipe's shape (--max_iters=0 writes it), 1,024 new tokens: the tokens/s each prints.
#   4. 124M training, learned and rope (lab.perf.bench: bf16 autocast, torch.compile, grad_accum 2), and nanoGPT's
#      bench.py beside it when nanoGPT is at $NANOGPT (default ../shared/peers/nanoGPT; a copy inside the
#      checkout travels to a device machine, ../shared does not).
#   5. the tests that need CUDA (they skip on a machine without it).
# Random tokens for the benchmarks: no dataset is needed but the one train.py prepares from the repository.
#
#     OUT=/tmp/gpu_check bash lab/perf/gpu_check.sh
#
# It writes 8 files under $OUT: env.txt, generate.log, figures.json (every figure of 1, 2 and 4), compiled.log
# (both compiled runs' output and TORCH_LOGS), user.log (3), train.log (4), pytest_cuda.log, summary.txt.
# Exit status: 0 when every step ran, 1 without CUDA (one line, nothing measured), else the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
NANOGPT=${NANOGPT:-../shared/peers/nanoGPT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False): nothing measured; run it on a GPU machine" \
        | tee "$OUT/summary.txt" >&2
    exit 1
fi

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
    git log -1 --format='commit %H %s' 2>/dev/null
} > "$OUT/env.txt" 2>&1

status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run it, note its exit status and time in the summary
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout "$limit" "$@"
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s$([ $rc -eq 124 ] && echo " (timed out after ${limit} s)")" \
        >> "$OUT/summary.txt"
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
}
: > "$OUT/summary.txt"

RECIPE=(--block_size=256 --n_layer=6 --n_head=6 --n_embd=384 --vocab_size=65)
GEN=(python3 -m lab.perf.bench --device=cuda --train_steps=0 --repeats=1 --reference_max_tokens=1)
# 1. eager against the CUDA graph; figures.json collects them (json_* files merged at the end)
step "generation, recipe shape, eager vs CUDA graph" 40 "${GEN[@]}" "${RECIPE[@]}" --gen_multiples 4 \
    --compile_decode=false --json="$OUT/json_recipe.json" > "$OUT/generate.log" 2>&1
step "generation, 124M, eager vs CUDA graph" 55 "${GEN[@]}" --config configs/gpt2_124m.toml --gen_multiples 1 \
    --compile_decode=false --json="$OUT/json_124m.json" >> "$OUT/generate.log" 2>&1
# 2. compiled decoding, captured by generation.CUDAGraphStep
export TORCH_LOGS=perf_hints,cudagraphs
step "compiled decoding, recipe shape, every scheme" 70 "${GEN[@]}" "${RECIPE[@]}" --gen_multiples 4 \
    --compile_decode=true --json="$OUT/json_recipe_compiled.json" > "$OUT/compiled.log" 2>&1
step "compiled decoding, 124M, rope" 40 "${GEN[@]}" --config configs/gpt2_124m.toml --pos=rope --gen_multiples 1 \
    --compile_decode=true --json="$OUT/json_124m_compiled.json" >> "$OUT/compiled.log" 2>&1
unset TORCH_LOGS
# 3. as a user types them
{
    step "python train.py --pos=rope" 60 python3 train.py --pos=rope
    step "python sample.py" 20 python3 sample.py
    step "train.py, recipe shape, 0 steps" 25 python3 train.py --config configs/shakespeare_char.toml --max_iters=0 \
        --compile=false --eval_iters=2 --out_dir=out/gpu_check_recipe
    step "sample.py, recipe shape, 1,024 tokens" 20 python3 sample.py --out_dir=out/gpu_check_recipe \
        --max_new_tokens=1024
} > "$OUT/user.log" 2>&1
# 4. training
step "lab.perf.bench 124M training, learned and rope" 90 python3 -m lab.perf.bench --config configs/gpt2_124m.toml \
    --device=cuda --dtype=bfloat16 --compile=true --grad_accum=2 --train_steps=10 --warmup_steps=2 \
    --pos=learned,rope --gen_multiples --json="$OUT/json_train.json" > "$OUT/train.log" 2>&1
if [ -f "$NANOGPT/bench.py" ]; then
    (cd "$NANOGPT" && step "nanoGPT bench.py (124M, batch 12 x 1024, compiled)" 60 python3 bench.py --real_data=False) \
        >> "$OUT/train.log" 2>&1
else
    echo "nanoGPT bench.py: not run, no $NANOGPT/bench.py" >> "$OUT/summary.txt"
fi
# 5. CUDA tests
step "pytest -k cuda" 40 python3 -m pytest -q -p no:cacheprovider -k cuda tests > "$OUT/pytest_cuda.log" 2>&1

python3 - "$OUT" <<'EOF' >> "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
merged = {p.stem.removeprefix("json_"): json.loads(p.read_text()) for p in sorted(out.glob("json_*.json"))}
(out / "figures.json").write_text(json.dumps(merged, indent=2) + "\n")
for p in out.glob("json_*.json"):
    p.unlink()
EOF
{
    echo "compiled.log: $(grep -ci 'skipping cudagraphs' "$OUT/compiled.log") 'skipping cudagraphs' lines"
    grep -h "tokens/s (" "$OUT/user.log" | sed 's/^/sample.py: /'
    tail -1 "$OUT/pytest_cuda.log" | sed 's/^/pytest: /'
} >> "$OUT/summary.txt"
cat "$OUT/env.txt" "$OUT/generate.log" "$OUT/summary.txt"
exit $status
