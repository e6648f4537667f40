"""PyTorch ops over the compiled kernels: validation, torch.library registration, autograd."""
from fastnorm.ops.family_functional import batch_norm, group_norm, instance_norm, normalize
from fastnorm.ops.functional import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm", "normalize"]
