"""fastnorm: fast, correct normalizations for PyTorch over any axis, shape and float dtype.

    import fastnorm
    y = fastnorm.layer_norm(x, (64, 256, 256), weight, bias)      # like F.layer_norm
    y = fastnorm.rms_norm(x, dim=1, eps=1e-5)                      # channels of NCHW, no copy
    model.norm = fastnorm.RMSNorm(4096)                            # drop-in for nn.RMSNorm

The normalization family, with torch.nn.functional / torch.nn semantics:
    y = fastnorm.group_norm(x, 8, weight, bias)                    # also instance_norm
    y = fastnorm.batch_norm(x, running_mean, running_var, w, b, training=True)  # updates running stats
    y = fastnorm.normalize(x, p=2, dim=1)                          # L1 / L2; dim=None: Frobenius
    loss = fastnorm.cross_entropy(logits, labels)                  # softmax over the classes, one pass
    model.bn = fastnorm.BatchNorm2d(64)                            # also GroupNorm, InstanceNorm1d/2d/3d
"""
from fastnorm.family_modules import (BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm1d,
                                     InstanceNorm2d, InstanceNorm3d)
from fastnorm.modules import LayerNorm, RMSNorm
from fastnorm.ops.family_functional import batch_norm, group_norm, instance_norm, normalize
from fastnorm.ops.functional import layer_norm, rms_norm
from fastnorm.ops.loss_functional import cross_entropy
from fastnorm.patching import patch, unpatch

__version__ = "0.1.0"
__all__ = ["LayerNorm", "RMSNorm", "layer_norm", "rms_norm", "patch", "unpatch",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d",
           "InstanceNorm3d", "batch_norm", "group_norm", "instance_norm", "normalize", "cross_entropy", "__version__"]
