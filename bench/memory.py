"""Peak device memory of one call, as bench/TARGETS.md measures it for the kernel benchmarks."""
import gc

import torch

MIB = 2**20


def peak_mib(fn, leaves=()):
    """MiB allocated during fn() above what was allocated before it; the leaves' .grad are cleared before
    and after, so gradients from an earlier call are neither counted nor kept."""
    for t in leaves:
        t.grad = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    for t in leaves:
        t.grad = None
    return peak
