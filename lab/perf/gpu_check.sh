#!/usr/bin/env bash
# The GPU checks in one call of at most 8 minutes on one GPU: the step timeouts below add up to 465 s, each
# step gets SIGTERM 5 s before its timeout and SIGKILL at it; the rest (env.txt, the summary) takes seconds.
# The timeouts are estimates, no GPU has run this script yet: summary.txt gives each step's time to size them.
#   1. generation, greedy, 1,024 new tokens, every scheme, eager KV cache against the CUDA graph ("same tokens"
#      checks one against the other), at the shakespeare_char recipe's shape (10.7M) and at GPT-2 124M, in
#      lab.perf.bench's default dtype there (bfloat16 on CUDA; the table's dtype column); the operators a
#      decode step launches, a column of the same table.
#   2. compiled decoding (the compiled step captured as one CUDA graph), rope only (an inductor compile each),
#      at the recipe's shape and at 124M, under TORCH_LOGS=recompiles,perf_hints: summary.txt counts the
#      "Recompiling function" lines (0: the static step compiled once per length, as it should).
#   3. python train.py --pos=rope, then python sample.py, as a user types them but for --out_dir, a fresh
#      folder under a temporary directory removed at the end (a second run measures again, and no run under
#      out/ is touched); train.py gets SIGTERM near its timeout, saves and stops, so sample.py has a
#      checkpoint either way (the timeout still counts as the step's failure). Then sample.py on an untrained
#      model of the recipe's shape (train.py --max_iters=0 writes it), 1,024 new tokens: the tokens/s each
#      prints.
#   4. 124M training, learned and rope (lab.perf.bench: bf16 autocast, torch.compile, grad_accum 2), and
#      nanoGPT's bench.py beside it, run in $NANOGPT: default peers/nanoGPT inside the checkout (it travels to
#      a device machine), else ../shared/peers/nanoGPT beside the checkout.
#   5. the tests that need CUDA (python -m pytest -k cuda tests; they skip on a machine without it).
# Random tokens for the benchmarks: no dataset is needed but the one train.py prepares from the repository.
#
#     OUT=/tmp/gpu_check bash lab/perf/gpu_check.sh
#     OUT=/tmp/gpu_check bash lab/perf/gpu_check.sh --dry-run   # every step's command on a CPU, tiny sizes
#
# --dry-run runs the same commands with only their size and device flags changed (a 1-layer model, 16 tokens,
# a CPU, no compile, no CUDA graph, a step or two), each under 3 x its timeout, in under a minute on two CPU
# cores: a moved file or a renamed flag fails it (tests/test_gpu_check.py runs it). nanoGPT's bench.py needs
# CUDA: a dry run only says where it is. $PYTHON: the interpreter (default python3).
#
# It writes 8 files under $OUT and nothing else: env.txt, generate.log (1), compiled.log (2: both runs'
# tables and their TORCH_LOGS lines), user.log (3), train.log (4), pytest_cuda.log (5), figures.json (the
# --json figures of 1, 2 and 4, kept in a temporary directory and merged on any exit, a cut-off run's too),
# summary.txt (each step's exit status and time; the counts and tokens/s lines). Those 8 of an earlier run
# are removed first. A SIGTERM or Ctrl-C to the script takes effect when the step running ends (bash waits
# for it, at most its timeout), noted in summary.txt; figures.json then holds the steps done.
# Exit status: 0 when every step ran, 1 without CUDA (one line, nothing measured; not in a dry run), 2 for a
# bad argument, else the first failure's (124 or 137: a step ran out of time).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1  # the repository root: this file is lab/perf/gpu_check.sh
case "${1-}" in
    "") DRY=0 ;;
    --dry-run) DRY=1 ;;
    *) echo "gpu_check.sh: unknown argument '$1': give none, or --dry-run" >&2; exit 2 ;;
esac
absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }  # links kept: a venv's python stays
PY=${PYTHON:-python3}
[[ $PY == */* ]] && PY=$(absolute "$PY")  # nanoGPT's step runs in its own folder
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1
if [ -z "${NANOGPT-}" ]; then
    NANOGPT=../shared/peers/nanoGPT
    [ -d peers/nanoGPT ] && NANOGPT=peers/nanoGPT
fi
[ -d "$NANOGPT" ] && NANOGPT=$(cd "$NANOGPT" && pwd)
export PYTHONUNBUFFERED=1
FILES=(env.txt generate.log compiled.log user.log train.log pytest_cuda.log figures.json summary.txt)
(cd "$OUT" && rm -f "${FILES[@]}")  # an earlier run's: none of them may pass for this run's

cuda="import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
if [ $DRY -eq 0 ] && ! "$PY" -c "$cuda" 2>/dev/null; then
    echo "gpu_check.sh: no CUDA GPU here (torch.cuda.is_available() is False): nothing measured;" \
        "run it on a GPU machine, or give --dry-run" | tee "$OUT/summary.txt" >&2
    exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 1  # json_* figures, train.py's runs: not $OUT
RUNS=$WORK/runs
merge() {  # $WORK/json_NAME.json -> figures.json {NAME: ...}; then the temporary directory goes
    "$PY" - "$WORK" "$OUT/figures.json" <<'EOF'
import json, pathlib, sys
work, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
merged = {p.stem.removeprefix("json_"): json.loads(p.read_text()) for p in sorted(work.glob("json_*.json"))}
target.write_text(json.dumps(merged, indent=2) + "\n")
EOF
    rm -rf "$WORK"
}
current="" status=0
stopped() {  # a signal to the script: it comes once the step running ends (bash waits for it)
    echo "${current:-between steps}: stopped by SIG$1 to gpu_check.sh" >> "$OUT/summary.txt"
    exit "$2"
}
trap merge EXIT
trap 'stopped TERM 143' TERM
trap 'stopped INT 130' INT

{
    echo "gpu_check.sh$([ $DRY -eq 1 ] && echo " --dry-run"), $(date -u +%Y-%m-%dT%H:%M:%SZ), $PY"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    else
        echo "nvidia-smi: not found"
    fi
    "$PY" -c "import torch; c = torch.cuda; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
c.get_device_name() if c.is_available() else 'no CUDA device')"
    git log -1 --format='commit %H %s' 2>/dev/null
    git status --porcelain -uno 2>/dev/null | sed 's/^/changed: /'
} > "$OUT/env.txt" 2>&1

step() {  # step NAME TIMEOUT_S COMMAND...: run it, note its exit status and time in the summary
    local name=$1 limit=$(($2 * (DRY ? 3 : 1))) start=$SECONDS
    shift 2
    current=$name
    timeout -k 5 $((limit - 5)) "$@"
    local rc=$?
    local late=""
    ((rc == 124 || rc == 137)) && late=" (timed out after ${limit} s)"
    echo "$name: exit $rc in $((SECONDS - start)) s$late" >> "$OUT/summary.txt"
    ((rc != 0 && status == 0)) && status=$rc
    current=""
}
: > "$OUT/summary.txt"

# The sizes: the real ones, or (--dry-run) the same flags again, later ones winning, at a CPU's tiny sizes
RECIPE=(--block_size=256 --n_layer=6 --n_head=6 --n_embd=384 --vocab_size=65)
GPT2=(--config configs/gpt2_124m.toml)
GEN=("$PY" -m lab.perf.bench --device=cuda --train_steps=0 --repeats=1 --reference_max_tokens=1)
X_RECIPE=4 X_GPT2=1 COMPILED=true  # new tokens: 4 x 256, 1 x 1024
TRAIN=(--device=cuda --dtype=bfloat16 --compile=true --grad_accum=2 --train_steps=10 --warmup_steps=2)
USER=() STEPS=() SAMPLE=() SAMPLE_TOKENS=1024
if [ $DRY -eq 1 ]; then
    TINY=(--block_size=16 --n_layer=1 --n_head=2 --n_embd=16)
    RECIPE+=("${TINY[@]}") GPT2+=("${TINY[@]}") X_RECIPE=1 COMPILED=false
    GEN+=(--device=cpu --matmul_size=64)
    TRAIN+=(--device=cpu --dtype=float32 --compile=false --train_steps=1 --warmup_steps=1 --batch_size=2
        --matmul_size=64)
    USER=(--device=cpu --compile=false "${TINY[@]}" --batch_size=2 --eval_iters=1) STEPS=(--max_iters=2)
    SAMPLE=(--device=cpu) SAMPLE_TOKENS=16
fi

# 1. eager against the CUDA graph
step "generation, recipe shape, eager vs CUDA graph" 35 "${GEN[@]}" "${RECIPE[@]}" --gen_multiples $X_RECIPE \
    --compile_decode=false --json="$WORK/json_recipe.json" > "$OUT/generate.log" 2>&1
step "generation, 124M, eager vs CUDA graph" 45 "${GEN[@]}" "${GPT2[@]}" --gen_multiples $X_GPT2 \
    --compile_decode=false --json="$WORK/json_124m.json" >> "$OUT/generate.log" 2>&1
# 2. compiled decoding, captured by generation.CUDAGraphStep
export TORCH_LOGS=recompiles,perf_hints
step "compiled decoding, recipe shape, rope" 45 "${GEN[@]}" "${RECIPE[@]}" --pos=rope \
    --gen_multiples $X_RECIPE --compile_decode=$COMPILED --json="$WORK/json_recipe_compiled.json" \
    > "$OUT/compiled.log" 2>&1
step "compiled decoding, 124M, rope" 55 "${GEN[@]}" "${GPT2[@]}" --pos=rope --gen_multiples $X_GPT2 \
    --compile_decode=$COMPILED --json="$WORK/json_124m_compiled.json" >> "$OUT/compiled.log" 2>&1
unset TORCH_LOGS
# 3. as a user types them, in fresh folders
{
    step "python train.py --pos=rope" 65 "$PY" train.py --pos=rope --out_dir="$RUNS/shakespeare_char_rope" \
        "${USER[@]}" "${STEPS[@]}"
    step "python sample.py" 15 "$PY" sample.py --out_dir="$RUNS/shakespeare_char_rope" "${SAMPLE[@]}"
    step "train.py, recipe shape, 0 steps" 20 "$PY" train.py --config configs/shakespeare_char.toml \
        --max_iters=0 --compile=false --eval_iters=2 --out_dir="$RUNS/recipe" "${USER[@]}"
    step "sample.py, recipe shape, 1,024 tokens" 15 "$PY" sample.py --out_dir="$RUNS/recipe" \
        --max_new_tokens=$SAMPLE_TOKENS "${SAMPLE[@]}"
} > "$OUT/user.log" 2>&1
# 4. training
step "lab.perf.bench 124M training, learned and rope" 85 "$PY" -m lab.perf.bench "${GPT2[@]}" "${TRAIN[@]}" \
    --pos=learned,rope --gen_multiples --json="$WORK/json_train.json" > "$OUT/train.log" 2>&1
nanogpt="nanoGPT bench.py (124M, batch 12 x 1024, compiled)"
if [ ! -f "$NANOGPT/bench.py" ]; then
    echo "$nanogpt: not run, no $NANOGPT/bench.py" >> "$OUT/summary.txt"
elif [ $DRY -eq 1 ]; then
    echo "$nanogpt: not run in a dry run (it needs CUDA), found at $NANOGPT/bench.py" >> "$OUT/summary.txt"
else
    step "$nanogpt" 45 env -C "$NANOGPT" "$PY" bench.py --real_data=False >> "$OUT/train.log" 2>&1
fi
# 5. CUDA tests
step "pytest -k cuda" 40 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests > "$OUT/pytest_cuda.log" 2>&1

{
    echo "compiled.log: $(grep -c 'Recompiling function' "$OUT/compiled.log") 'Recompiling function' lines"
    grep -hE "tokens/s($|[^a-z])" "$OUT/user.log" | sed 's/^/sample.py: /'
    tail -1 "$OUT/pytest_cuda.log" | sed 's/^/pytest: /'
} >> "$OUT/summary.txt"
cat "$OUT/env.txt" "$OUT/generate.log" "$OUT/summary.txt"
exit $status
