"""fastnorm: fast, correct LayerNorm and RMSNorm for PyTorch over any axis, shape and float dtype.

    import fastnorm
    y = fastnorm.layer_norm(x, (64, 256, 256), weight, bias)      # like F.layer_norm
    y = fastnorm.rms_norm(x, dim=1, eps=1e-5)                      # channels of NCHW, no copy
    model.norm = fastnorm.RMSNorm(4096)                            # drop-in for nn.RMSNorm
"""
from fastnorm.modules import LayerNorm, RMSNorm
from fastnorm.ops.functional import layer_norm, rms_norm
from fastnorm.patching import patch, unpatch

__version__ = "0.1.0"
__all__ = ["LayerNorm", "RMSNorm", "layer_norm", "rms_norm", "patch", "unpatch", "__version__"]
