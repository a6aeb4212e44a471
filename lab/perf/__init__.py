"""Performance tools: bench.py (python -m lab.perf.bench, every scheme's training and generation speed), ab.py
(python -m lab.perf.ab, A/B ratios against a git revision), gpu_check.sh (the GPU checks); docs/perf.md."""
