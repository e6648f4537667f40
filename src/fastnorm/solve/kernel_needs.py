"""What a solution's kernel build must hold, and which launch configurations are worth timing in it.

From the extension calls recorded on the traced shapes (extension_calls.py): the entry points they
call, their input dtypes and, for norm_forward, the kernel family the planner gives each call
(planner_rules.py). The tuning grid keeps a configuration only when every call stays on a family of
the build under it and launches differently from the configurations before it: an override the
planner ignores for these shapes (threads for the resident kernel), or one that moves a call to a
family left out, is not timed.
"""
from fastnorm.kernels.selection import DTYPES, FUNCTIONS, KernelSelection
from fastnorm.solve.planner_rules import CudaDevice, family_paths, launch_key, norm_family


def selection_for(calls: list, device_type: str, dev: CudaDevice = CudaDevice(), fallback_functions=FUNCTIONS):
    """The KernelSelection the calls need. No calls recorded (the helpers took PyTorch's own path on the
    traced inputs): `fallback_functions` with every dtype and family, for the other paths."""
    if not calls:
        return KernelSelection.everything(device_type, fallback_functions)
    functions = tuple(f for f in FUNCTIONS if any(c.function == f for c in calls))
    dtypes = frozenset(DTYPES[c.dtype] for c in calls)
    families = frozenset(norm_family(c, device_type, dev) for c in calls if c.function == "norm_forward")
    families |= frozenset(path for c in calls for path in family_paths(c, device_type, dev))
    return KernelSelection(device_type, functions, dtypes, families)


def tune_configs(calls: list, selection: KernelSelection, grid: list, dev: CudaDevice = CudaDevice()) -> list:
    """The (threads, blocks_per_row) pairs of `grid` (auto first) that launch the norm_forward calls
    differently from each other, on families of the selection only."""
    norm_calls = [c for c in calls if c.function == "norm_forward"]
    if not norm_calls:
        return [(0, 0)]
    configs, seen = [], set()
    for threads, blocks_per_row in grid:
        families = {norm_family(c, selection.device_type, dev, threads, blocks_per_row) for c in norm_calls}
        if not families <= selection.families:
            continue
        key = tuple(launch_key(c, selection.device_type, dev, threads, blocks_per_row) for c in norm_calls)
        if key not in seen:
            seen.add(key)
            configs.append((threads, blocks_per_row))
    return configs or [(0, 0)]
