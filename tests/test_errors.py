"""run_cli reports refused input as one line and exit status 2; bugs keep their traceback."""

from __future__ import annotations

import pytest

from core.errors import EXIT_INPUT_ERROR, InputError, run_cli


def _refuse(argv):
    raise InputError("--train_file missing.txt: no such file; expected a UTF-8 text file")


def test_input_error_becomes_one_line_and_exit_2(capsys):
    assert run_cli(_refuse, ["--train_file", "missing.txt"]) == EXIT_INPUT_ERROR == 2
    err = capsys.readouterr().err
    assert err == "error: --train_file missing.txt: no such file; expected a UTF-8 text file\n"


def test_debug_shows_the_traceback():
    with pytest.raises(InputError, match="missing.txt"):
        run_cli(_refuse, ["--debug"])


def test_status_passes_through_and_bugs_propagate():
    assert run_cli(lambda argv: None, []) == 0
    assert run_cli(lambda argv: 3, []) == 3
    with pytest.raises(ZeroDivisionError):
        run_cli(lambda argv: 1 / 0, [])
