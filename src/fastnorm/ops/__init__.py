"""PyTorch ops over the compiled kernels: validation, torch.library registration, autograd."""
from fastnorm.ops.functional import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm"]
