"""What recognition found: one normalization of the traced graph and the fused-helper call replacing it."""
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from fastnorm.solve.trace import TensorInfo


@dataclass(frozen=True)
class AttrRef:
    """`self.<path>` of the model, read at forward time (so constructor arguments are honoured)."""
    path: str


@dataclass
class NormMatch:
    kind: str                  # "LayerNorm", "RMSNorm", "BatchNorm", "InstanceNorm", "GroupNorm", "L1Norm", ...
    written_as: str            # how the reference wrote it, for the report
    helper: str                # the fused helper of the generated file that replaces it
    args: tuple                # helper's positional arguments: fx Nodes, constants or AttrRefs
    kwargs: dict               # helper's keyword arguments, same kinds of values
    output: fx.Node            # the node whose uses the fused call takes over
    matched: list              # nodes of the reference subgraph (dropped once unused)
    x: TensorInfo              # the normalized input as traced
    begin: int                 # normalized dims [begin, end) of x
    end: int
    weight: bool
    bias: bool
    eps: Any                   # value for the report; None: as F.rms_norm takes it (validate.default_rms_eps)
    eps_source: str            # where eps comes from, for the report
    over: str = ""             # what is reduced, when [begin, end) does not say it (BatchNorm, GroupNorm, ...)

    @property
    def dims_text(self) -> str:
        if self.over:
            return self.over
        return f"dim {self.begin}" if self.end == self.begin + 1 else f"dims {self.begin}..{self.end - 1}"

    def describe(self) -> str:
        dims = self.dims_text
        affine = " + ".join(n for n, present in (("weight", self.weight), ("bias", self.bias)) if present)
        eps = "finfo(dtype).eps" if self.eps is None else f"{self.eps:g}" if isinstance(self.eps, (int, float)) \
            else str(self.eps)
        return (f"{self.kind} over {dims} of {self.x.describe()}"
                f"{', ' + affine if affine else ', no weight'}, eps={eps} ({self.eps_source}); "
                f"written as {self.written_as}")
