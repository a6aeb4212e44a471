"""Make the repository root importable (model.py, train.py, sample.py, data/) from the tests."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
