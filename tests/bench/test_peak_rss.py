"""The benches' CPU peak memory (``bench/_script_env.py``: ``start_peak_rss`` / ``peak_rss_mb``) in a process started
by a parent that had used more memory: the child's own peak, not the parent's (``ru_maxrss`` is carried across exec on
Linux)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

CHILD = f"""
import json, resource, sys
sys.path.insert(0, {str(BENCH)!r})
import _script_env
before = _script_env.start_peak_rss()
block = bytearray(64 * 2**20)
block[::4096] = b"x" * len(block[::4096])  # touch every page: 64 MB resident
inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"peak": _script_env.peak_rss_mb(before), "ru_maxrss": inherited}}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc: the high-water mark reset")
def test_peak_is_the_child_own_not_the_parent_peak():
    parent = bytearray(400 * 2**20)
    parent[::4096] = b"x" * len(parent[::4096])  # the parent's resident set now over 400 MB
    child = json.loads(subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout)
    del parent
    assert 60 <= child["peak"] <= 100, child  # the 64 MB it allocated, and the interpreter's small change
    assert child["ru_maxrss"] > 400, child  # what the benches read before: the parent's peak
