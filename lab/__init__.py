"""The lab: studies, measurements, benchmarks, demos, fine-tuning and the course, run as `python -m lab.NAME`
from the repository root. Nothing outside this folder imports it: delete it and the GPT still trains and
samples.

Every `python -m lab.NAME` starts as train.py and sample.py do, here, before NAME's imports (torch, seconds):
runpy imports this package first, with sys.argv[0] still "-m" while it looks for NAME. A Ctrl-C from then
until NAME's main enters one_line_errors ends the process at once with status 130, printing nothing
(quiet_ctrl_c); one that reaches the top after main's one_line_errors has ended (the interpreter about to
exit) does too, instead of a traceback."""

import sys

if sys.argv[:1] == ["-m"]:
    import os
    import signal
    from contextlib import suppress

    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))  # while plumbing loads

    from plumbing.errors import quiet_ctrl_c

    def quiet_keyboard_interrupt(kind, value, traceback, previous=sys.excepthook):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, traceback)
        with suppress(OSError, ValueError):  # what the command printed: os._exit flushes nothing
            sys.stdout.flush()
        os._exit(128 + getattr(value, "signum", signal.SIGINT))  # Stopped: its signal's

    quiet_ctrl_c()
    sys.excepthook = quiet_keyboard_interrupt
