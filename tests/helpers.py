"""Helpers shared by the test files (pytest puts this folder on sys.path)."""

import pytest

import train


def error_line(capsys, script, argv, status):
    """script.main(argv) exits with `status` (2: a bad flag or value, 1: a run that cannot start or go on) and
    one line on stderr, `NAME.py: error: ...`, never argparse's usage block; -> that line."""
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == status
    err = capsys.readouterr().err.strip()
    prog = f"{script.__name__.rsplit('.', 1)[-1]}.py"
    assert err.startswith(f"{prog}: error: ") and "\n" not in err and "usage:" not in err, err
    return err


def train_error_line(capsys, argv, status):
    return error_line(capsys, train, argv, status)
