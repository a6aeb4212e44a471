"""Performance tools beside bench.py: ab.py (python -m perf.ab, model A/B ratios in one process) and
gpu_check.sh (the GPU checks in one call). Figures and how they were measured: docs/perf.md."""
