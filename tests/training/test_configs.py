"""The accelerate config files load with accelerate's own reader and say what they promise."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path):
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(path))


def test_cpu_two_process_config_starts_two_torchrun_processes():
    config = _load(ROOT / "configs" / "cpu-2proc.yaml")
    # MULTI_GPU + use_cpu false selects accelerate's torchrun launcher (use_cpu would start a single process);
    # training.loop.make_accelerator then asks for Accelerator(cpu=True) when no GPU is present
    assert config.distributed_type.value == "MULTI_GPU" and config.num_processes == 2 and not config.use_cpu
    assert config.mixed_precision == "no" and config.num_machines == 1
    # one machine, a free port chosen at launch: two such runs (or two test workers) do not collide
    assert config.main_process_ip == "127.0.0.1" and config.main_process_port == 0


def test_fsdp_cpu_config_takes_a_free_port():
    config = _load(ROOT / "configs" / "fsdp-cpu.yaml")
    assert config.distributed_type.value == "FSDP" and config.num_processes == 2
    assert config.main_process_ip == "127.0.0.1" and config.main_process_port == 0


def test_default_multi_gpu_config_is_ddp_bf16():
    config = _load(ROOT / "accelerate_config.yaml")
    assert config.distributed_type.value == "MULTI_GPU" and config.mixed_precision == "bf16"


def test_fsdp_config_wraps_the_sesame_bert_layer():
    config = _load(ROOT / "configs" / "fsdp.yaml")
    assert config.distributed_type.value == "FSDP"
    assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "SesameBertLayer"
    import modeling.bert.modeling_sesame_bert as m

    assert hasattr(m, "SesameBertLayer")


def test_no_accelerator_device_means_cpu(monkeypatch):
    import torch

    from training.accelerator import _no_accelerator_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if getattr(torch.backends, "mps", None) is not None:
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if getattr(torch, "xpu", None) is not None:
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    assert _no_accelerator_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not _no_accelerator_device()


def test_one_process_config_goes_through_torchrun_with_every_value_given(tmp_path, monkeypatch, caplog):
    """``configs/one-process.yaml`` (the README's main command): accelerate's launch validation picks its torchrun
    launcher (``multi_gpu``, which forwards SIGTERM and waits) for one process on a free loopback port, and warns
    about no value it had to choose (the "``--num_processes`` was set to a value of ``0``" warning); the same
    validation without a config picks the simple launcher and warns, which shows the check sees both."""
    import logging

    import accelerate.commands.launch as launch

    config = _load(ROOT / "configs" / "one-process.yaml")
    assert config.distributed_type.value == "MULTI_GPU" and config.num_processes == 1 and not config.use_cpu
    assert config.main_process_ip == "127.0.0.1" and config.main_process_port == 0 and config.num_machines == 1
    parser = launch.launch_command_parser()
    with caplog.at_level(logging.WARNING):
        args, _, _ = launch._validate_launch_command(
            parser.parse_args(["--config_file", str(ROOT / "configs" / "one-process.yaml"), "pretrain"])
        )
    assert args.multi_gpu and int(args.num_processes) == 1 and not args.cpu
    assert "values were not passed" not in caplog.text
    monkeypatch.setattr(launch, "default_config_file", str(tmp_path / "none.yaml"))  # a fresh machine
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        args, _, _ = launch._validate_launch_command(parser.parse_args(["pretrain"]))
    assert not args.multi_gpu or int(args.num_processes) > 1  # the simple launcher, unless several GPUs
    assert "values were not passed" in caplog.text and "--num_processes" in caplog.text
