"""No code run unasked, nothing pushed from outside the folder, nothing listening beyond this machine: a tokenizer
folder with code of its own is refused by ``pretrain`` (even with ``y`` on stdin), a symbolic link in an output
folder stops the push naming it, and the single-machine configs meet on the loopback interface."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from _launch import ROOT, pretrain_command
from _launch import subprocess_env as _env


def test_pretrain_refuses_a_tokenizer_folder_with_its_own_code_even_with_yes_on_stdin(assets, tmp_path):
    tok = tmp_path / "evil-tok"
    marker = tmp_path / "code-ran"
    (tok).mkdir()
    for name in ("vocab.txt", "tokenizer.json", "special_tokens_map.json"):
        if (assets / "wordpiece" / name).exists():
            (tok / name).write_bytes((assets / "wordpiece" / name).read_bytes())
    config = json.loads((assets / "wordpiece" / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["evil_tokenizer.EvilTokenizer", None]}
    config.pop("tokenizer_class", None)  # only the folder's code names a class
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    (tok / "evil_tokenizer.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import BertTokenizer as EvilTokenizer\n"
    )
    env = {**_env(), "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [
            *pretrain_command(1),
            *["--train_file", str(assets / "train.txt"), "--tokenizer_name", str(tok), "--config_name", "bert-tiny"],
            *["--max_train_steps", "1", "--output_dir", str(tmp_path / "out")],
        ],
        cwd=ROOT,
        env=env,
        input="y\ny\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --tokenizer_name"), proc.stderr[-2000:]
    assert "trust_remote_code" in proc.stderr and not marker.exists()


def test_push_refuses_symbolic_links_naming_them_before_contacting_the_hub(tmp_path):
    from core.errors import InputError
    from training.hub import push_output_dir

    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text("SECRET")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.txt").symlink_to(private / "id_rsa")
    (out / "extra").symlink_to(private, target_is_directory=True)
    with pytest.raises(InputError) as err:  # offline in the tests: any network call would fail otherwise
        push_output_dir(out, "alice/linked", token="hf_x")
    assert "symbolic links" in str(err.value) and "notes.txt" in str(err.value) and "extra" in str(err.value)
    (out / "notes.txt").unlink()
    (out / "extra").unlink()
    from training.hub import _local_files

    assert _local_files(out, None, []) == ["config.json"]


@pytest.mark.parametrize("config", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_single_machine_configs_meet_on_loopback(config: Path):
    settings = yaml.safe_load(config.read_text())
    if settings.get("num_machines", 1) == 1 and settings.get("num_processes", 1) > 1:
        assert settings.get("main_process_ip") == "127.0.0.1", config


def test_gloo_listens_on_loopback_when_every_process_is_on_this_machine(monkeypatch):
    from training.accelerator import _gloo_on_loopback

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    _gloo_on_loopback()
    import os

    assert os.environ["GLOO_SOCKET_IFNAME"].startswith("lo")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")  # several machines: the interface is the user's choice
    _gloo_on_loopback()
    assert "GLOO_SOCKET_IFNAME" not in os.environ
