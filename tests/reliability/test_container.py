"""``accelerate launch`` with one process inside a container (issue 32, item 7), and the README's main command on a
fresh machine (item 5).

A container's entry process (PID 1 of a PID namespace) forwards SIGTERM to the launcher it started and exits when
the launcher does; the kernel then kills every process left in the namespace. Reproduced with ``unshare --pid
--fork --mount-proc bash entry.sh ...`` and SIGTERM to the namespace's PID 1 during training: through
``configs/one-process.yaml`` (torchrun, which forwards the signal and waits for its worker) the worker writes its
checkpoint and prints its ``error:`` line; through accelerate's single-process launcher (its choice for one process
without a config) the launcher dies at once and nothing is written -- pinned here because docs/reliability.md says so.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _launch import ROOT, run_ok
from _launch import asset_args as _args
from _launch import subprocess_env as _env

ONE_PROCESS = ROOT / "configs" / "one-process.yaml"

#: A container's entry script: start the command, forward SIGTERM to it (only to it), wait for it, exit with it.
ENTRY = """\
"$@" &
child=$!
trap 'kill -TERM "$child"' TERM
wait "$child"
wait "$child"
"""


def _unshare() -> list[str]:
    """The ``unshare`` prefix that starts a PID namespace here (``--map-root-user`` where the plain one is refused,
    as for a user without CAP_SYS_ADMIN); skips the test, with the reason, where neither is permitted."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("needs Linux and util-linux's unshare")
    reasons = []
    plain = ["unshare", "--pid", "--fork", "--mount-proc"]
    for prefix in (plain, [*plain[:1], "--map-root-user", *plain[1:]]):
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return prefix
        reasons.append(f"{' '.join(prefix)}: {probe.stderr.strip()}")
    pytest.skip("a PID namespace cannot be created here: " + "; ".join(reasons))


def _namespace_init(unshare_pid: int, timeout: float = 30.0) -> int:
    """The host pid of the namespace's PID 1 (the child ``unshare --fork`` started)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("unshare started no namespace")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["one-process.yaml", "none"])
def test_sigterm_to_a_containers_init_checkpoints_through_the_one_process_config(assets, tmp_path, config):
    """SIGTERM to PID 1 of a PID namespace running ``entry.sh accelerate launch [--config_file
    configs/one-process.yaml] pretrain`` (bert-tiny, a few steps in): through the config, ``checkpoints/step_N`` is
    written and the log has the worker's one ``error: training stopped on request`` line naming it; without a
    config (accelerate's simple launcher) neither."""
    unshare = _unshare()
    entry = tmp_path / "entry.sh"
    entry.write_text(ENTRY)
    out = tmp_path / "out"
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    if config != "none":
        launch += ["--config_file", str(ONE_PROCESS)]
    args = _args(assets, out, "--max_train_steps", "2000", "--checkpointing_steps", "5000", "--logging_steps", "1")
    env = {**_env(), "HF_HOME": str(tmp_path / "hf_home")}  # a fresh machine: no accelerate default config
    run = subprocess.Popen(
        [*unshare, "bash", str(entry), *launch, "pretrain", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    # a hung run: SIGKILL to the namespace's PID 1 ends every process in it and closes the pipe read below
    watchdog = threading.Timer(240, lambda: os.kill(init, signal.SIGKILL))
    try:
        init = _namespace_init(run.pid)
        watchdog.start()
        signalled_at = None
        for line in run.stdout:  # the pipe closes when every process of the namespace has ended
            lines.append(line)
            if signalled_at is None and re.search(r"step \d+/2000:", line):
                time.sleep(0.5)  # some steps into training (the first line: after the 2 warm-up steps)
                os.kill(init, signal.SIGTERM)  # the namespace's PID 1 alone, as a container runtime does
                signalled_at = time.time()
        run.wait(timeout=60)
    finally:
        watchdog.cancel()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    log = "".join(lines)
    assert signalled_at is not None, log[-3000:]
    steps = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    stops = [line for line in lines if line.startswith("error: training stopped on request")]
    if config == "none":  # accelerate's simple launcher: dies at once, the namespace with it (docs/reliability.md)
        assert steps == [] and stops == [], log[-3000:]
        assert "`--num_processes` was set to a value of" in log  # and it warns on a fresh machine
        return
    assert len(steps) == 1 and 1 < steps[0] < 2000, log[-3000:]
    assert len(stops) == 1 and f"checkpoint {out / 'checkpoints' / f'step_{steps[0]}'} written" in stops[0], log[-3000:]
    assert "num_processes" not in log, log[-3000:]
    assert not (out / "all_results.json").exists()


def _readme_main_command() -> list[str]:
    """The ``accelerate launch ...`` part of the README's "Install and run the main job" command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^pip install -e \. && (accelerate launch .*pretrain)$", readme, re.MULTILINE)
    assert match, "README: the main command (pip install -e . && accelerate launch ... pretrain) not found"
    return match.group(1).split()


@pytest.mark.parametrize("command", ["readme", "plain"])
def test_the_readme_main_command_prints_no_num_processes_warning_on_a_fresh_machine(tmp_path, command):
    """The README's main command gives accelerate every value (``configs/one-process.yaml``): no "``--num_processes``
    was set to a value of ``0``" warning, even without an accelerate default config; the plain ``accelerate launch
    pretrain`` (still working) warns there, which shows the check can see the warning."""
    words = _readme_main_command() if command == "readme" else ["accelerate", "launch", "pretrain"]
    assert words[:2] == ["accelerate", "launch"] and words[-1] == "pretrain"
    env = {**_env(), "HF_HOME": str(tmp_path / "hf_home")}  # no accelerate default config
    result = run_ok([sys.executable, "-m", "accelerate.commands.launch", *words[2:], "--help"], ROOT, env)
    assert "--train_file" in result.stdout  # pretrain's own help: the worker ran
    output = result.stdout + result.stderr
    if command == "readme":
        assert "num_processes" not in output and "values were not passed" not in output, output[-3000:]
    else:
        assert "`--num_processes` was set to a value of" in output, output[-3000:]
