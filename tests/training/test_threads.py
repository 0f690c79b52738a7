"""Issue 43: each process uses the CPU threads it has -- the CPUs of its affinity mask and container quota over the
local processes -- whether started by ``accelerate launch`` (which exports ``OMP_NUM_THREADS=1``), torchrun or
``python -m``; a user's ``OMP_NUM_THREADS`` / ``--num_cpu_threads_per_process`` wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from training.threads import choose_threads, cpu_quota

ROOT = Path(__file__).resolve().parents[2]
#: What ``accelerate launch`` puts in a worker's environment for a job it does not treat as a CPU job.
ACCELERATE = {"OMP_NUM_THREADS": "1", "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_MIXED_PRECISION": "no"}
LAUNCH = (["accelerate", "launch", "--config_file", "configs/one-process.yaml", "pretrain"], {"PATH": "/usr/bin"})


def test_the_launchers_default_is_replaced_by_the_cpus_over_the_local_processes():
    one = choose_threads({**ACCELERATE, "LOCAL_WORLD_SIZE": "1"}, affinity=8, quota=None, launcher=LAUNCH)
    assert one.threads == 8 and "launcher's OMP_NUM_THREADS=1 replaced" in one.reason
    assert one.describe().startswith("8 CPU threads per process (8 usable CPUs: affinity mask 8, no CPU quota; 1 local")
    two = choose_threads({**ACCELERATE, "LOCAL_WORLD_SIZE": "2"}, affinity=8, quota=None, launcher=LAUNCH)
    assert two.threads == 4 and "2 local processes" in two.reason
    quota = choose_threads({**ACCELERATE, "LOCAL_WORLD_SIZE": "2"}, affinity=8, quota=3, launcher=LAUNCH)
    assert quota.threads == 1 and "3 usable CPUs: affinity mask 8, CPU quota 3" in quota.reason
    # torchrun alone (2 processes) sets OMP_NUM_THREADS=1 too
    torchrun = choose_threads(
        {"OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"},
        affinity=6,
        quota=None,
        launcher=(["torchrun", "--nproc_per_node", "2", "-m", "pretrain"], {}),
    )
    assert torchrun.threads == 3


def test_a_users_choice_wins():
    flag = (["accelerate", "launch", "--num_cpu_threads_per_process", "3", "pretrain"], {})
    chosen = choose_threads({**ACCELERATE, "OMP_NUM_THREADS": "3"}, affinity=8, quota=None, launcher=flag)
    assert (chosen.threads, chosen.reason) == (3, "--num_cpu_threads_per_process 3, yours")
    exported = (LAUNCH[0], {"OMP_NUM_THREADS": "1"})  # OMP_NUM_THREADS=1 accelerate launch ...
    assert choose_threads(ACCELERATE, affinity=8, quota=None, launcher=exported).threads == 1
    # python -m: the environment is the user's
    assert choose_threads({"OMP_NUM_THREADS": "5"}, affinity=8, quota=2, launcher=None).threads == 5
    # a launcher that cannot be read: the value is kept
    assert choose_threads(ACCELERATE, affinity=8, quota=None, launcher=None).threads == 1


def test_python_m_takes_the_affinity_mask_and_the_quota_not_every_core():
    assert choose_threads({}, affinity=2, quota=None, launcher=None).threads == 2
    assert choose_threads({}, affinity=16, quota=4, launcher=None).threads == 4
    assert choose_threads({"LOCAL_WORLD_SIZE": "4"}, affinity=2, quota=None, launcher=None).threads == 1  # >= 1


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: rounded up
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cpu_quota_of_cgroup_v1_and_v2(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(tmp_path) == expected


#: A worker: pins itself to the first ``CPUS`` CPUs of its mask, then chooses its threads as make_accelerator does
#: (``configure_cpu_threads`` without importing torch, which would take seconds per worker; ``TORCH=1``: with it).
WORKER = textwrap.dedent(
    """
    import json, os
    cpus = sorted(os.sched_getaffinity(0))[: int(os.environ["CPUS"])]
    os.sched_setaffinity(0, cpus)
    from training import threads
    if os.environ.get("TORCH"):
        import torch
        choice = threads.configure_cpu_threads()
        assert torch.get_num_threads() == choice.threads
    else:
        choice = threads.choose_threads(os.environ, threads.affinity_cpus(), threads.cpu_quota(), threads._launcher())
    print(json.dumps([choice.threads, choice.reason]))
    """
)
#: A launcher: started without OMP_NUM_THREADS (unless the test gives one), it starts the worker as accelerate does.
LAUNCHER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    env = {**os.environ, **json.loads(sys.argv[1])}
    sys.exit(subprocess.run([sys.executable, "-c", sys.argv[2]], env=env).returncode)
    """
)


def _launch(worker_env: dict, launcher_env: dict | None = None, launcher_args: tuple = ()) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(launcher_env or {}, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", LAUNCHER, json.dumps(worker_env), WORKER, *launcher_args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    threads, reason = json.loads(proc.stdout.strip().splitlines()[-1])
    return threads, reason


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs in the affinity mask")
def test_a_worker_under_a_simulated_accelerate_launch_gets_the_cpus_of_its_mask():
    # accelerate's OMP_NUM_THREADS=1, 1 local process, a mask of 2 CPUs: 2 threads (was 1)
    assert _launch({**ACCELERATE, "LOCAL_WORLD_SIZE": "1", "CPUS": "2", "TORCH": "1"})[0] == 2
    # 2 local processes share the 2 CPUs; a mask of 1 CPU gives 1
    assert _launch({**ACCELERATE, "LOCAL_WORLD_SIZE": "2", "CPUS": "2"})[0] == 1
    assert _launch({**ACCELERATE, "LOCAL_WORLD_SIZE": "1", "CPUS": "1"})[0] == 1
    # the user's OMP_NUM_THREADS in the launcher's environment, or --num_cpu_threads_per_process, wins
    threads, reason = _launch({**ACCELERATE, "OMP_NUM_THREADS": "3", "CPUS": "2"}, {"OMP_NUM_THREADS": "3"})
    assert (threads, reason) == (3, "OMP_NUM_THREADS=3, yours")
    flag = ("--num_cpu_threads_per_process", "3")
    assert _launch({**ACCELERATE, "OMP_NUM_THREADS": "3", "CPUS": "2"}, launcher_args=flag)[0] == 3
    # python -m (no launcher variables): the mask, not every core
    assert _launch({"CPUS": "1"})[0] == 1
