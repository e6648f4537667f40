"""The CUDA kernels a call launches, by name (torch.profiler): for tests that check which kernel a planner picks."""
import torch


def kernels_of(fn):
    """Names of the CUDA kernels fn launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
