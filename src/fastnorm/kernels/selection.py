"""What a single-file solution's kernel build holds: entry points, input dtypes, kernel families.

`fastnorm solve` picks these from the calls its solution makes on the traced shapes; the kernel
sources then keep only that code (kernel_set.h's FASTNORM_WANT_* guards, resolved in the text by
kernels/inline.py). The package's own build holds everything.
"""
from dataclasses import dataclass

# Binding entry points a solution can call (the others, norm_backward and add_norm_forward, serve the
# package's autograd and residual ops).
FUNCTIONS = ("norm_forward", "group_norm_forward", "batch_norm_forward", "p_normalize")
FAMILY_FUNCTIONS = ("group_norm_forward", "batch_norm_forward", "p_normalize")
# Input dtypes by torch name (str(torch.float32) without "torch.") -> the code of their guard.
DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
# norm_forward's kernel families (planner.cuh), in the planner's order of preference; the CPU kernels
# have "row" (last-dim rows) and "channel" (a non-trailing axis) only. Then the CUDA forward paths of the
# normalization family (family.cu): "family_sets" (a block a set), "family_passes" (the multi-kernel path) and
# "group_chain" (group_norm_forward's chained sets of 256 KB - 16 MB), "group_held" (the held chain, of those
# sets of 2 MB and more; not float64).
FAMILIES = {
    "cuda": ("held_rows", "resident", "streamed", "cluster", "few_rows", "offset_rows", "split", "split_uncached", "row", "channel", "residual",
             "family_sets", "family_passes", "group_chain", "group_held"),
    "cpu": ("row", "channel"),
}


# The fused residual add serves add_norm_forward, which no solution binds: never selected.
_NEVER_CALLED = frozenset({"residual"})


@dataclass(frozen=True)
class KernelSelection:
    """The entry points, input dtypes and norm_forward kernel families one build holds."""
    device_type: str
    functions: tuple   # entry points to bind, in FUNCTIONS order
    dtypes: frozenset  # input dtype codes ("f32", ...), each with the weight dtypes it takes
    families: frozenset  # of FAMILIES[device_type]

    def __post_init__(self):
        unknown = (set(self.functions) - set(FUNCTIONS)) | (set(self.dtypes) - set(DTYPES.values())) | (
            set(self.families) - set(FAMILIES[self.device_type]))
        if unknown:
            raise ValueError(f"fastnorm: unknown kernel selection entries {sorted(unknown)}")

    @classmethod
    def everything(cls, device_type: str, functions=FUNCTIONS) -> "KernelSelection":
        """Every dtype and every family a solution can call (still only `functions`)."""
        return cls(device_type, tuple(f for f in FUNCTIONS if f in functions), frozenset(DTYPES.values()),
                   frozenset(FAMILIES[device_type]) - _NEVER_CALLED)

    def widened(self) -> "KernelSelection":
        """The same entry points and dtypes with every family a solution can call: for shapes whose
        family the selection missed."""
        return KernelSelection(self.device_type, self.functions, self.dtypes,
                               frozenset(FAMILIES[self.device_type]) - _NEVER_CALLED)

    @property
    def needs_norm_forward(self) -> bool:
        return "norm_forward" in self.functions

    @property
    def needs_family(self) -> bool:
        return any(f in self.functions for f in FAMILY_FUNCTIONS)

    def symbols(self) -> dict:
        """Each preprocessor symbol the build fixes: defined (True) or not (False)."""
        # Not FASTNORM_INLINE: a selected source includes the per-operator ATen headers itself, as the
        # package's own build does, and is built without torch/extension.h where load_inline allows.
        known = {"FASTNORM_CUDA": self.device_type == "cuda", "FASTNORM_INLINE": False,
                 "FASTNORM_SELECTED_KERNELS": True}
        for code in DTYPES.values():
            known[f"FASTNORM_WANT_{code.upper()}"] = code in self.dtypes
        for family in set(FAMILIES["cuda"]) | set(FAMILIES["cpu"]):
            known[f"FASTNORM_WANT_{family.upper()}"] = family in self.families
        known["FASTNORM_WANT_P_NORM"] = "p_normalize" in self.functions  # the family's |x| and x^2 sums
        return known

    def describe(self) -> str:
        families = sorted(self.families, key=FAMILIES[self.device_type].index)
        dtypes = sorted(self.dtypes, key=list(DTYPES.values()).index)
        return (f"{', '.join(self.functions)}; dtypes {', '.join(dtypes)}"
                + (f"; kernel families {', '.join(families)}" if self.needs_norm_forward else ""))
