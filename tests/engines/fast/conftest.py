import pytest
import torch


@pytest.fixture
def exact_fp32():
    """On a GPU, fp32 convolutions default to TF32 in cuDNN (~1e-3 relative per conv), and the fast engine's
    cuDNN autotuning picks other algorithms than eager: full fp32 on both sides, so a 1e-4 check tests the
    rewrite, not the rounding mode. (No effect on the CPU.)"""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
