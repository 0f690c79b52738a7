"""CPU threads per process: the CPUs this process may use, divided among the processes of the run on this machine.

torch takes one thread per core of the machine by default, also when another job shares those cores (an affinity
mask or a container's CPU quota gives this process fewer); and ``accelerate launch`` exports ``OMP_NUM_THREADS=1``
to every process it does not treat as a CPU job -- the README's main command, ``accelerate launch --config_file
configs/one-process.yaml pretrain``, trained with one thread on any CPU machine (torchrun does the same for two or
more processes). :func:`configure_cpu_threads` sets ``torch.set_num_threads`` to

* a user's own choice when there is one: ``OMP_NUM_THREADS`` set by the user (in the environment of ``python -m``,
  or of the launcher), or ``accelerate launch --num_cpu_threads_per_process N`` (which accelerate exports as
  ``OMP_NUM_THREADS``);
* else the usable CPUs -- those of the process's affinity mask (``os.sched_getaffinity``), at most the container's
  CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up) -- divided by the
  processes of the run on this machine (``LOCAL_WORLD_SIZE``, set by torchrun; 1 without it), at least 1.

A launcher's ``OMP_NUM_THREADS`` is told from a user's by the launcher's own start: the worker's parent process
(accelerate or torchrun) is read in ``/proc/<ppid>/`` -- its command line (``--num_cpu_threads_per_process``) and the
environment it was started with (``OMP_NUM_THREADS``). Where those cannot be read, the value is kept (a user's).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Environment variables that only a launcher sets in its workers' environment (accelerate, torchrun).
LAUNCHER_VARIABLES = (
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "ACCELERATE_DYNAMO_BACKEND",
    "ACCELERATE_MIXED_PRECISION",
)


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """Threads for one process and why: ``threads`` (>= 1) and ``reason`` (one phrase for the plan line)."""

    threads: int
    reason: str

    def describe(self) -> str:
        """``"2 CPU threads per process (2 usable CPUs: affinity mask 2, no CPU quota; 1 local process)"``."""
        return f"{self.threads} CPU thread{'s' * (self.threads != 1)} per process ({self.reason})"


def cpu_quota(root: str | os.PathLike = "/sys/fs/cgroup") -> int | None:
    """The container's CPU quota in whole CPUs (rounded up), or None without one: cgroup v2 ``cpu.max``
    (``"<quota> <period>"``, ``"max ..."`` = none) in ``root`` or in this process's own cgroup below it, else cgroup v1
    ``cpu/cpu.cfs_quota_us`` (-1 = none) over ``cpu.cfs_period_us``. Unreadable or malformed files count as none."""
    root = Path(root)
    own = _own_cgroup()
    for folder in ([root / own.lstrip("/")] if own else []) + [root]:
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota == "max":
            return None
        return _whole_cpus(quota, period)
    try:
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return None if quota.startswith("-") else _whole_cpus(quota, period)


def _whole_cpus(quota: str, period: str) -> int | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in ``/proc/self/cgroup``), or None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] if line[3:] not in ("", "/") else None
    except OSError:
        pass
    return None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.sched_getaffinity``; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _launcher() -> tuple[list[str], dict[str, str]] | None:
    """The parent process's command line and the environment it was started with (``/proc/<ppid>/``), or None."""
    folder = Path("/proc") / str(os.getppid())
    try:
        cmdline = (folder / "cmdline").read_bytes().split(b"\0")
        environ = (folder / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    env = dict(item.decode(errors="replace").split("=", 1) for item in environ if b"=" in item)
    return [a.decode(errors="replace") for a in cmdline if a], env


def choose_threads(
    env: Mapping[str, str],
    affinity: int,
    quota: int | None,
    launcher: tuple[Sequence[str], Mapping[str, str]] | None,
) -> ThreadChoice:
    """The threads of one process (pure: :func:`configure_cpu_threads` passes the real values).

    Args:
        env: this process's environment (``OMP_NUM_THREADS``, ``LOCAL_WORLD_SIZE``, the launcher's variables).
        affinity: CPUs in the affinity mask.
        quota: the container's CPU quota in whole CPUs, or None.
        launcher: the parent's command line and start environment, or None when unreadable.

    Returns:
        A user's ``OMP_NUM_THREADS`` / ``--num_cpu_threads_per_process`` when given, else the usable CPUs over the
        local processes (at least 1).
    """
    given = env.get("OMP_NUM_THREADS", "").strip()
    launched = any(name in env for name in LAUNCHER_VARIABLES)
    if given.isdigit() and int(given) > 0:
        if not launched or launcher is None:
            return ThreadChoice(int(given), f"OMP_NUM_THREADS={given}, yours")
        cmdline, launcher_env = launcher
        if any(a == "--num_cpu_threads_per_process" or a.startswith("--num_cpu_threads_per_process=") for a in cmdline):
            return ThreadChoice(int(given), f"--num_cpu_threads_per_process {given}, yours")
        if "OMP_NUM_THREADS" in launcher_env:
            return ThreadChoice(int(given), f"OMP_NUM_THREADS={given}, yours")
        # else the launcher's default (accelerate: 1 for a job it does not treat as a CPU job; torchrun: 1)
    local = env.get("LOCAL_WORLD_SIZE", "1")
    local_processes = int(local) if local.isdigit() and int(local) > 0 else 1
    usable = min(affinity, quota) if quota else affinity
    threads = max(1, usable // local_processes)
    limits = f"affinity mask {affinity}, " + (f"CPU quota {quota}" if quota else "no CPU quota")
    plural = "es" if local_processes != 1 else ""
    launcher_note = f"; the launcher's OMP_NUM_THREADS={given} replaced" if given and launched else ""
    reason = f"{usable} usable CPUs: {limits}; {local_processes} local process{plural}{launcher_note}"
    return ThreadChoice(threads, reason)


#: The choice of this process (:func:`configure_cpu_threads`), for the plan lines; None before it.
_CHOSEN: ThreadChoice | None = None


def configure_cpu_threads() -> ThreadChoice:
    """Choose this process's CPU threads (:func:`choose_threads` on the real environment, affinity mask, CPU quota
    and launcher) and apply them with ``torch.set_num_threads``; returns the choice (also :func:`chosen`)."""
    global _CHOSEN
    import torch

    choice = choose_threads(os.environ, affinity_cpus(), cpu_quota(), _launcher())
    torch.set_num_threads(choice.threads)
    _CHOSEN = choice
    return choice


def chosen() -> ThreadChoice | None:
    """The choice :func:`configure_cpu_threads` made in this process, or None."""
    return _CHOSEN


__all__ = ["ThreadChoice", "affinity_cpus", "choose_threads", "chosen", "configure_cpu_threads", "cpu_quota"]
