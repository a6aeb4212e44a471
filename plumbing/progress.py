"""Progress of long work outside training (preparing a large dataset, lab.eval_length's windows): a tqdm bar
on a terminal, a few whole lines elsewhere."""

import sys
import time
from contextlib import AbstractContextManager

from plumbing.report import format_seconds


class PlainProgress(AbstractContextManager):
    """tqdm's update / set_postfix_str / with, as a few whole lines: at each quarter of total (without one,
    every minute) and at the end; file None: silent."""

    def __init__(self, total, unit, desc, file):
        self.total, self.unit, self.desc, self.file = total, unit, desc or "progress", file
        self.done, self.postfix, self.start, self.printed, self.quarter = 0, "", time.perf_counter(), 0.0, 0

    def update(self, n=1):
        self.done += n
        elapsed = time.perf_counter() - self.start
        quarter = 4 * self.done // self.total if self.total else 0
        if quarter > self.quarter or (not self.total and elapsed - self.printed >= 60):
            self.quarter, self.printed = quarter, elapsed
            self.say()

    def say(self):
        if self.file is None:
            return
        of = f"/{self.total:,} ({self.done / self.total:.0%})" if self.total else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        elapsed = format_seconds(time.perf_counter() - self.start)
        print(f"{self.desc}: {self.done:,}{of} {self.unit}{postfix}, {elapsed}", file=self.file, flush=True)

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def __exit__(self, *exc):
        if self.quarter < 4 and self.done:  # the last line says where it ended
            self.say()


def progress_bar(total, unit, desc=None, enabled=True, file=None):
    """A tqdm bar where `file` (stderr) is a terminal; elsewhere (a log, a pipe, CI) PlainProgress's lines."""
    file = file or sys.stderr
    if enabled and file.isatty():
        from tqdm import tqdm

        return tqdm(total=total, unit=unit, desc=desc, unit_scale=True, file=file, dynamic_ncols=True)
    return PlainProgress(total, unit, desc, file if enabled else None)
