"""Performance tools: bench.py (python -m perf.bench, every scheme's training and generation speed),
ab.py (python -m perf.ab, model A/B ratios in one process) and gpu_check.sh (the GPU checks in one call).
Figures and how they were measured: docs/perf.md."""
