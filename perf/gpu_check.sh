#!/usr/bin/env bash
# The GPU checks in one call of at most ~8 minutes (the timeouts below add up to 470 s):
#   1. perf.bench training on GPT-2 124M (configs/gpt2_124m.toml) on one GPU, bf16 autocast, torch.compile:
#      ms/step, tokens/s, MFU against the card's bf16 peak, compile time and peak memory, the schemes the targets
#      name first (learned, rope, alibi), so that a timeout costs the others. grad_accum 2 (32,768 tokens a step)
#      keeps a step short.
#   2. perf.bench generation, cached vs uncached at 1 x block_size (1024 new tokens), every scheme, in a run of its
#      own: a slow compile in 1 cannot take its time.
#   3. compiled decoding (where generation.py offers it) on rope, in a run of its own (the reference is skipped: 2
#      measured it).
#   4. the tests that need CUDA (they skip on a machine without it).
# TORCH_LOGS="recompiles,graph_breaks" goes to torch_logs*.txt; summary.txt counts both. Every figure is in the
# JSON files. Random tokens: no dataset is needed.
#
#     OUT=/tmp/gpu_check bash perf/gpu_check.sh       # writes env.txt, bench_124m.{json,log} (training),
#                                                     # generate_124m.{json,log}, decode_124m.{json,log},
#                                                     # torch_logs*.txt, pytest_cuda.log, summary.txt under $OUT
#
# Exit status: 0 when all four ran, 1 without CUDA (one line, nothing measured), else the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
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
} > "$OUT/env.txt" 2>&1

status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run it, note its exit status in the summary
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@"
    local rc=$?
    echo "$name: exit $rc$([ $rc -eq 124 ] && echo " (timed out after ${limit} s; the JSON keeps what was measured)")" \
        >> "$OUT/summary.txt"
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
}
: > "$OUT/summary.txt"

BENCH=(python3 -m perf.bench --config configs/gpt2_124m.toml --device=cuda --dtype=bfloat16 --compile=true
       --grad_accum=2 --train_steps=10 --warmup_steps=2 --repeats=1)
SCHEMES=--pos=learned,rope,alibi,sinusoidal,none   # the targets' schemes first
TORCH_LOGS="recompiles,graph_breaks" step "perf.bench 124M training, all schemes" 270 \
    "${BENCH[@]}" $SCHEMES --gen_multiples --json="$OUT/bench_124m.json" \
    > "$OUT/bench_124m.log" 2> "$OUT/torch_logs.txt"
step "perf.bench 124M generation, all schemes" 90 \
    "${BENCH[@]}" $SCHEMES --train_steps=0 --gen_multiples 1 --compile_decode=false \
    --json="$OUT/generate_124m.json" > "$OUT/generate_124m.log" 2>&1
TORCH_LOGS="recompiles,graph_breaks" step "perf.bench 124M, compiled decoding, rope" 70 \
    "${BENCH[@]}" --pos=rope --train_steps=0 --gen_multiples 1 --compile_decode=true --reference_max_tokens=1 \
    --json="$OUT/decode_124m.json" > "$OUT/decode_124m.log" 2> "$OUT/torch_logs_decode.txt"
step "pytest -m 'not slow' -k cuda" 40 python3 -m pytest -q -m "not slow" -k cuda tests > "$OUT/pytest_cuda.log" 2>&1

for log in torch_logs.txt torch_logs_decode.txt; do
    echo "$log: $(grep -c 'Graph break' "$OUT/$log") graph-break lines, $(grep -c 'Recompiling function' "$OUT/$log") recompiles" \
        >> "$OUT/summary.txt"
done
tail -1 "$OUT/pytest_cuda.log" | sed 's/^/pytest: /' >> "$OUT/summary.txt"
cat "$OUT/env.txt" "$OUT/bench_124m.log" "$OUT/generate_124m.log" "$OUT/decode_124m.log" "$OUT/summary.txt"
exit $status
