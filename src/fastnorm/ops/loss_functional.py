"""fastnorm.cross_entropy: torch.nn.functional.cross_entropy for class-index targets, as one softmax
normalization pass over each row of logits (ops/loss_ops.py) instead of a float32 copy of the logits,
a log_softmax and a gather."""
import torch

from fastnorm.ops import loss_ops  # registers torch.ops.fastnorm.cross_entropy
from fastnorm.ops.validate import SUPPORTED_DTYPES


def _check(logits, target, reduction):
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError("fastnorm.cross_entropy: logits and target must be tensors")
    if logits.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"fastnorm.cross_entropy: logits dtype {logits.dtype} is not supported "
                        "(float32, float16, bfloat16 or float64)")
    if logits.dim() not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError("fastnorm.cross_entropy: logits must be (classes,) or (rows, classes) with at least one "
                         f"class, got shape {list(logits.shape)}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise TypeError("fastnorm.cross_entropy: target must hold class indices (an integer tensor), "
                        f"got {target.dtype}; class probabilities are not supported")
    rows = () if logits.dim() == 1 else (logits.shape[0],)
    if tuple(target.shape) != rows:
        raise ValueError(f"fastnorm.cross_entropy: target of shape {list(target.shape)} does not match logits of "
                         f"shape {list(logits.shape)} (expected {list(rows)})")
    if target.device != logits.device:
        raise ValueError(f"fastnorm.cross_entropy: target on {target.device}, logits on {logits.device}")
    if logits.device.type not in ("cpu", "cuda"):
        raise ValueError(f"fastnorm.cross_entropy: logits on {logits.device}: fastnorm runs on CPU and CUDA")
    if reduction not in loss_ops.REDUCTIONS:
        raise ValueError(f"fastnorm.cross_entropy: reduction must be one of {loss_ops.REDUCTIONS}, got {reduction!r}")


def cross_entropy(logits, target, ignore_index: int = -100, reduction: str = "mean"):
    """Softmax cross-entropy of `logits` (rows, classes) or (classes,) against class indices `target`,
    with torch.nn.functional.cross_entropy's `ignore_index` and `reduction` ("mean" over the rows not
    ignored, "sum", "none"). Computed in float32 (float64 for float64 logits) and returned in that dtype,
    like F.cross_entropy(logits.float(), target), without the float32 copy; the gradient of the logits
    comes in their own dtype. A target outside [0, classes) other than ignore_index gives NaN, where
    PyTorch's CUDA kernel would stop the process with a device assert."""
    _check(logits, target, reduction)
    rows = logits if logits.dim() == 2 else logits.unsqueeze(0)
    if rows.shape[1] > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    labels = target.reshape(-1).to(torch.int64).contiguous()
    out, _, _ = torch.ops.fastnorm.cross_entropy(rows, labels, int(ignore_index), loss_ops.REDUCTIONS.index(reduction))
    return out if logits.dim() == 2 or reduction != "none" else out[0]
