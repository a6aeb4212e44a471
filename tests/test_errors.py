"""The one signal mechanism: a second Ctrl-C never cuts a checkpoint being written (StopSignals.deferred), it
stops the script as soon as the file is whole."""

import os
import signal

import pytest

from plumbing.errors import Stopped, StopSignals


def test_a_second_ctrl_c_inside_a_deferred_block_stops_only_after_it():
    """The first Ctrl-C asks to stop; the second, arriving mid-write, lets the write finish, then raises."""
    finished = []
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.received == "SIGINT"
        with pytest.raises(Stopped):
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this thread
                finished.append("the whole write")
    assert finished == ["the whole write"]


def test_a_deferred_block_without_a_second_signal_raises_nothing():
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGINT)
        with signals.deferred():
            pass
    assert signals.received == "SIGINT"


def test_a_ctrl_c_lost_inside_a_callback_still_stops_the_script_quietly():
    """A KeyboardInterrupt raised where Python ignores exceptions (a weakref's or an import lock's callback)
    would let the script run on and exit 0; one_line_errors sends it again, so the script stops with 130."""
    import subprocess
    import sys

    code = (
        "import time, weakref\n"
        "from plumbing.errors import one_line_errors\n"
        "class Thing: pass\n"
        "def interrupted(ref): raise KeyboardInterrupt\n"
        "with one_line_errors('script'):\n"
        "    thing = Thing(); ref = weakref.ref(thing, interrupted); del thing\n"
        "    time.sleep(5)\n"
        "    print('ran on')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")
