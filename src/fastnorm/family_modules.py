"""Drop-in BatchNorm, InstanceNorm and GroupNorm modules: subclasses of torch.nn's, with their
constructors, attributes, input checks and state_dicts; forward runs on fastnorm's functions."""
import torch
from torch import nn

from fastnorm.ops.family_functional import batch_norm, group_norm, instance_norm
from fastnorm.ops.family_ops import activation_code


class _BatchNormForward:
    """torch's _BatchNorm.forward on fastnorm.batch_norm: training uses (and, with track_running_stats,
    updates) batch statistics, momentum=None a cumulative average over num_batches_tracked; eval uses
    the running statistics when there are any."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        pass_buffers = not self.training or self.track_running_stats  # only these are updated or read
        return batch_norm(input, self.running_mean if pass_buffers else None,
                          self.running_var if pass_buffers else None, self.weight, self.bias, use_batch_stats,
                          factor, self.eps)


class BatchNorm1d(_BatchNormForward, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d on fastnorm kernels: input (N, C) or (N, C, L)."""


class BatchNorm2d(_BatchNormForward, nn.BatchNorm2d):
    """torch.nn.BatchNorm2d on fastnorm kernels: input (N, C, H, W)."""


class BatchNorm3d(_BatchNormForward, nn.BatchNorm3d):
    """torch.nn.BatchNorm3d on fastnorm kernels: input (N, C, D, H, W)."""


class _InstanceNormApply:
    """torch's _InstanceNorm keeps its forward (input checks, unbatched input); only the call it ends
    in runs on fastnorm.instance_norm, with torch's arguments."""

    def _apply_instance_norm(self, input: torch.Tensor) -> torch.Tensor:
        return instance_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                             self.training or not self.track_running_stats,
                             self.momentum if self.momentum is not None else 0.0, self.eps)


class InstanceNorm1d(_InstanceNormApply, nn.InstanceNorm1d):
    """torch.nn.InstanceNorm1d on fastnorm kernels: input (N, C, L) or unbatched (C, L)."""


class InstanceNorm2d(_InstanceNormApply, nn.InstanceNorm2d):
    """torch.nn.InstanceNorm2d on fastnorm kernels: input (N, C, H, W) or unbatched (C, H, W)."""


class InstanceNorm3d(_InstanceNormApply, nn.InstanceNorm3d):
    """torch.nn.InstanceNorm3d on fastnorm kernels: input (N, C, D, H, W) or unbatched (C, D, H, W)."""


class GroupNorm(nn.GroupNorm):
    """torch.nn.GroupNorm on fastnorm kernels: input (N, C, *). activation="silu" makes it GroupNorm then
    SiLU in one kernel pass (nn.Sequential(nn.GroupNorm(...), nn.SiLU()) of diffusion blocks); the
    parameters and state_dict are nn.GroupNorm's either way."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, activation=None):
        activation_code(activation)  # a bad name fails here, not at the first forward
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps, activation=self.activation)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        return extra if self.activation is None else f"{extra}, activation={self.activation!r}"
