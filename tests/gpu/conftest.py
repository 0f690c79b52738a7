"""Fixtures of the CUDA tests (``python -m pytest -m gpu``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def no_tf32():
    """float32 really in float32 (no TF32 tensor-core rounding) for the comparisons at 1e-5."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
