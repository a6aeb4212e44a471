"""The plumbing every script shares: checkpoints and a run's state, flags, errors and signals, processes,
hardware, run folders, output files, the training log. What measures a model is in lab/measure/."""
