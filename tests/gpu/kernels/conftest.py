"""Loads the CUDA build's fused ops into torch.ops.tigon once, before the GPU kernel suites import."""
import os

import torch

LIB = os.environ.get("TIGON_KERNELS_LIB")
if not LIB:
    raise RuntimeError("set TIGON_KERNELS_LIB to the CUDA build's libtigon_kernels.so")
torch.ops.load_library(LIB)
if not torch.cuda.is_available():
    raise RuntimeError("this suite needs a CUDA device")
