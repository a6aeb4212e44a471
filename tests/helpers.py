"""Helpers shared by the test files (pytest puts this folder on sys.path)."""

import pytest

import train


def train_error_line(capsys, argv, status):
    """train.main(argv) exits with `status` (2: a bad flag or value, 1: a run that cannot start or go on) and
    one line on stderr; -> that line."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == status
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error: ") and "\n" not in err, err
    return err
