"""How a script stops: one exception type, one handler per entry point, one signal mechanism.

    raise UserError(f"{path}: no such checkpoint file")           # one line, exit status 1
    raise UserError("give --rope_scaling with --rope_factor", 2)   # a usage mistake: 2, as argparse's
    with one_line_errors("train.py"):                             # around each entry point's main, once
    with StopSignals() as signals:                                # Ctrl-C / SIGTERM: signals.received
    with reading(path, "checkpoint"): ckpt = torch.load(path)      # any failure: one line naming path
    with hardware.out_of_memory("lower --batch_size"): train(...)  # an allocation refused: one line
    if __name__ == "__main__": quiet_ctrl_c()                     # an entry point, before importing torch

A UserError is what the user can fix; anything else is a bug and keeps its traceback. A signal asks a loop to
stop, or raises Stopped, a KeyboardInterrupt that unwinds the with-blocks (removing temporary files and locks)
before the handler exits with 128 + the signal's number. A file the user names is read inside reading(): what
goes wrong there is the file's fault, whatever Python raised."""

import os
import signal
import sys
import threading
from contextlib import contextmanager


class UserError(ValueError):
    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


@contextmanager
def reading(path, what, fix=None, status=1):
    """The one boundary around reading a file the user names (a checkpoint, a dataset's meta.json, a preset, a
    factors file) and what it records: any exception becomes the UserError `PATH: not a usable WHAT (Type:
    reason)`, then `; FIX` if given, e.g. `out/x/ckpt.pt: not a usable checkpoint (KeyError: 'model')`, with
    `status` (2: a file a flag names). A UserError (a message already meant for the user), running out of
    memory (the machine's fault, not the file's) and KeyboardInterrupt/SystemExit (no Exception) pass."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        if out_of_memory_error(e):  # hardware.out_of_memory words it
            raise
        reason, fix = first_line(e), f"; {fix}" if fix else ""
        raise UserError(f"{path}: not a usable {what} ({type(e).__name__}: {reason}){fix}", status) from None


def first_line(error, default="no details"):
    """Python's reason for an exception in one line: its message's first line, at most 200 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = lines[0] if lines else default
    return reason if len(reason) <= 200 else reason[:197] + "..."


def out_of_memory_error(e):
    """Whether exception e is an allocation refused: torch.OutOfMemoryError (CUDA; a RuntimeError), the CPU
    allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory: ..."), Python's MemoryError."""
    oom = isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
    return oom or (isinstance(e, RuntimeError) and "can't allocate memory" in str(e))


class Stopped(KeyboardInterrupt):
    """A signal raised as Python raises KeyboardInterrupt for SIGINT: with-blocks clean up on the way out."""

    signum = property(lambda self: self.args[0])  # Stopped(signum)


def quiet_ctrl_c():
    """Until one_line_errors takes over, a Ctrl-C (SIGINT) ends the process at once with status 130, printing
    nothing: an entry point sets it before it imports torch or matplotlib (seconds), where Python's
    KeyboardInterrupt would print a traceback from inside their import."""
    signal.signal(signal.SIGINT, exit_at_once)


def exit_at_once(signum, frame):
    os._exit(128 + signum)  # nothing to clean up yet; SystemExit could be lost in an import's callback


@contextmanager
def one_line_errors(prog, status=None, errors=(ValueError,), stopped=None):
    """An entry point's handler: a UserError, or one of `errors`, becomes `prog: error: message` and
    SystemExit(its status, 2, or `status`); Ctrl-C or Stopped becomes 128 + the signal's number. A Ctrl-C that
    strikes inside a callback Python ignores exceptions in (an import lock's, a weakref's) is sent again."""
    # under torchrun every rank meets a UserError at the same point: rank 0 alone says it
    previous_hook, master = sys.unraisablehook, os.environ.get("RANK", "0") == "0"

    def redeliver(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            signum = getattr(unraisable.exc_value, "signum", signal.SIGINT)  # sent from outside this hook:
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()  # a signal here would be lost too
        else:
            previous_hook(unraisable)

    sys.unraisablehook = redeliver
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread and signal.getsignal(signal.SIGINT) is exit_at_once:  # quiet_ctrl_c's: a Ctrl-C now
        signal.signal(signal.SIGINT, signal.default_int_handler)  # raises, the with-blocks cleaning up
    try:
        yield
    except (UserError, *errors) as e:
        if master:
            print(f"{prog}: error: {e}" if prog else f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(status or getattr(e, "status", 2)) from None
    except KeyboardInterrupt as e:
        if main_thread:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while we say it: a traceback
        signum = getattr(e, "signum", signal.SIGINT)
        if stopped and master:
            print(stopped.format(signal=signal.Signals(signum).name), file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None
    finally:
        sys.unraisablehook = previous_hook


class StopSignals:
    """While active (in the main thread), SIGINT and SIGTERM ask to stop (request=True: the first sets
    `received`, for a loop to finish its step and save; a second Ctrl-C raises Stopped) or stop at once
    (request=False: Stopped, where SIGTERM's default would end the process with no cleanup)."""

    def __init__(self, request=True):
        self.request, self.received, self.previous = request, None, {}
        self.deferring, self.pending = False, None  # inside deferred(), the signal that will stop it

    def _handle(self, signum, frame):
        if self.request and not (self.received and signum == signal.SIGINT):
            self.received = self.received or signal.Signals(signum).name  # a flag: printing could re-enter
        elif self.deferring:  # it stops when the block ends
            self.pending = signum
        else:
            raise Stopped(signum)

    @contextmanager
    def deferred(self):
        """A block no signal may cut (a checkpoint being written): one that would stop the script stops it
        as soon as the block ends, so the file is whole."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending is not None:
            raise Stopped(self.pending)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def exit_status(stopped):
    """0 for a finished run, 128 + the signal's number for one a signal stopped (its name, or None); "a signal
    to another rank" is no name: torchrun stops this rank with SIGTERM."""
    return 0 if stopped is None else 128 + getattr(signal, stopped, signal.SIGTERM)
