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
