"""Fixtures for the hub tests: a Hub-compatible server on 127.0.0.1 and a real client in subprocesses.

``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HOME``, ``HF_HUB_OFFLINE`` and ``HF_HUB_DISABLE_XET`` once,
at import time, and the test process has imported it already with ``HF_HUB_OFFLINE=1`` (tests/conftest.py).
So every client call runs in a fresh ``python`` subprocess whose environment points at the server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _launch import hub_env, load_module

_HERE = Path(__file__).resolve().parent
hub_server = load_module(_HERE / "hub_server.py", "sesame_tests_hub_server")

#: Tokens the test Hub knows: alice may write (and read her private repos) with the first, only read
#: with the second; bob writes in his own namespace only.
WRITE_TOKEN = "hf_alice_write_0123456789"
READ_TOKEN = "hf_alice_read_0123456789"
OTHER_TOKEN = "hf_bob_write_0123456789"
TOKENS = {WRITE_TOKEN: ("alice", "write"), READ_TOKEN: ("alice", "read"), OTHER_TOKEN: ("bob", "write")}
#: A hub client process's settings beyond :func:`_launch.hub_env`'s: quiet, no telemetry or update checks, a short
#: ETag timeout.
_CLIENT_SETTINGS = {
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_ETAG_TIMEOUT": "5",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
}


class Hub:
    """The running test server plus helpers to run client code against it in a subprocess."""

    write_token, read_token, other_token = WRITE_TOKEN, READ_TOKEN, OTHER_TOKEN

    def __init__(self, server, tmp_path: Path):
        self.server = server
        self.tmp_path = tmp_path

    @property
    def url(self) -> str:
        """The server's URL (a new port after ``server.stop(); server.start()``; the client cache does not
        depend on it)."""
        return self.server.url

    def env(self, hf_home: Path, token: str | None = None, offline: bool = False, xet: bool = False) -> dict[str, str]:
        """Environment of a client process: this server, a given ``HF_HOME``, optional ``HF_TOKEN``."""
        env = hub_env(self.url, hf_home, offline=offline, **_CLIENT_SETTINGS)
        if token is not None:
            env["HF_TOKEN"] = token
        if xet:  # let the client try Xet storage, which this server does not offer
            del env["HF_HUB_DISABLE_XET"]
        return env

    def run(
        self,
        code: str,
        hf_home: Path,
        token: str | None = None,
        offline: bool = False,
        timeout: float = 120,
        cwd: Path | None = None,
        xet: bool = False,
    ) -> dict:
        """Run ``code`` in ``python -c``; it must print one JSON object as its last stdout line.

        Returns that object. Fails the test (with stdout/stderr) when the process exits non-zero.
        """
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=self.env(hf_home, token, offline, xet),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.tmp_path,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"client process failed ({proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
            )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no JSON result printed\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        return json.loads(lines[-1])


@pytest.fixture
def hub(tmp_path):
    """A fresh Hub-compatible server (own repos, refs, LFS store) on 127.0.0.1, stopped after the test."""
    server = hub_server.HubServer(TOKENS).start()
    try:
        yield Hub(server, tmp_path)
    finally:
        server.stop()
        assert not server.running


@pytest.fixture(scope="module")
def module_hub(tmp_path_factory):
    """One server for a whole test module (expensive pushes reused by several tests), stopped after it."""
    server = hub_server.HubServer(TOKENS).start()
    try:
        yield Hub(server, tmp_path_factory.mktemp("module_hub"))
    finally:
        server.stop()
