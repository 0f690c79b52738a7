"""A SIGTERM that arrives while the final outputs are written does not cut the save short: the outputs are
completed, then the run exits 143 with one ``error:`` line saying so."""

from __future__ import annotations

import os
import signal

from _launch import tiny_run_args

from core.errors import run_cli


def test_sigterm_during_the_final_save_completes_it_then_exits_143(assets, tmp_path, monkeypatch, capsys, fresh_state):
    from pretrain.cli import main
    from training.driver import Run

    real_save = Run.save

    def save(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, in the middle of the final save
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(Run, "save", save)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    assert run_cli(main, tiny_run_args(assets, out, "--max_train_steps", "4")) == 143
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "SIGTERM received while saving" in lines[0] and "complete" in lines[0], err[-2000:]
    assert (out / "model.safetensors").is_file() and (out / "all_results.json").is_file()
    assert signal.getsignal(signal.SIGTERM) is before  # the handler of the save is gone
