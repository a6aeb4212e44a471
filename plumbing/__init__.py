"""The plumbing every script shares: checkpoints, flags, processes, hardware, the training log, evaluation."""
