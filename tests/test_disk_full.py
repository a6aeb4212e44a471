"""A write that fails for lack of space is one line saying what was written, what is kept whole and how much
space it needs. The full disk is a file-size limit (RLIMIT_FSIZE) in a subprocess running the real entry
point, SIGXFSZ ignored so that a write past it fails with EFBIG as one to a full disk fails with ENOSPC."""

import os
import resource
import shutil
from pathlib import Path

import pytest
from helpers import TINY_RUN, run_limited

from data.common import DATA_ROOT

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 16_384  # bytes: more than a lock file or a probe, less than a tiny checkpoint or dataset


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs POSIX resource limits")
@pytest.mark.parametrize("what", ["checkpoint", "dataset"])
def test_a_write_past_the_space_left_is_one_line_and_keeps_what_was_whole(tmp_path, what):
    """train.py's checkpoint and data.text.prepare's dataset, each too large for the space left: exit 1 or 2,
    one line naming the file, the space it needs, and that nothing whole was lost; no file half-written."""
    if what == "checkpoint":
        out_dir = tmp_path / "run"
        done = run_limited(LIMIT, "train.py", *TINY_RUN, f"--out_dir={out_dir}")
        words = [
            f"could not write {out_dir / 'ckpt.pt'}: File too large (needs about",
            "no checkpoint was written",
        ]
        left = sorted(p.name for p in out_dir.iterdir()) if out_dir.exists() else []
    else:
        name = f"test_disk_full_{os.getpid()}"
        text = tmp_path / "book.txt"
        text.write_text("to be or not to be, that is the question\n" * 2000)
        try:
            done = run_limited(LIMIT, "-m", "data.text.prepare", f"--input={text}", f"--name={name}")
            left = sorted(p.name for p in DATA_ROOT.glob(f"*{name}*"))
        finally:
            shutil.rmtree(DATA_ROOT / name, ignore_errors=True)
        words = [
            f"could not write {DATA_ROOT / name}: File too large (needs about",
            "no dataset was half-written",
        ]
    err = done.stderr.strip()
    assert done.returncode in (1, 2) and "\n" not in err and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert left == [], left
