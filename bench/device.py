"""What the kernel benchmarks share: the H200's measured ceilings and loading Tigon's kernels."""
import os
import sys

import torch

HBM_BYTES_PER_S = 4.3e12  # device-to-device copy, measured
BF16_FLOPS_PER_S = 790e12  # bf16 matrix product, measured


def load_tigon():
    """torch.ops.tigon from the CUDA build's libtigon_kernels.so named by TIGON_KERNELS_LIB."""
    lib = os.environ.get("TIGON_KERNELS_LIB")
    if not lib:
        sys.exit("set TIGON_KERNELS_LIB to the CUDA build's libtigon_kernels.so")
    torch.ops.load_library(lib)
    return torch.ops.tigon
