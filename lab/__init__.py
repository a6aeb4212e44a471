"""The lab: studies, measurements, benchmarks, demos, fine-tuning and the course, run as `python -m lab.NAME`
from the repository root. Nothing outside this folder imports it: delete it and the GPT still trains and
samples."""
