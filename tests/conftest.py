"""Make the repository root importable (model.py, train.py, sample.py, data/) from the tests."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The suite runs thousands of tiny ops: extra intra-op threads only add synchronisation, and on a busy
# machine their spin-waits make a 30 ms generation take seconds.
torch.set_num_threads(1)
