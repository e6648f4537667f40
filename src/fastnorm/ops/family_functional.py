"""Public functional API of the normalization family, with torch.nn.functional semantics: group_norm,
instance_norm, batch_norm (running statistics updated in place, as torch updates them) and normalize
(also over several consecutive dims, and by the mean instead of the sum)."""
import math
import numbers

import torch
import torch.nn.functional as F

from fastnorm.ops.family_ops import accumulator_dtype, activation_code, call
from fastnorm.ops.functional import fast_entry, layer_norm
from fastnorm.ops.validate import check_channel_input, norm_dims


def _kernel_dtype(t, x):
    """weight, bias or statistics in a dtype the kernels take: x's or the accumulator's (others converted)."""
    return t if t is None or t.dtype == x.dtype else t.to(accumulator_dtype(x.dtype))


def _check_values(count: int, x, what: str, op: str) -> None:
    """torch's check that statistics are taken over more than one value (else the variance is 0/0)."""
    if count == 1:
        raise ValueError(f"fastnorm.{op}: expected more than 1 {what}, got input size {list(x.shape)}")


def _update_running(running, stat, momentum: float, correction: float = 1.0) -> None:
    """running <- momentum * stat * correction + (1 - momentum) * running, in place, as torch does (the
    correction n / (n - 1) makes a biased variance unbiased): in float32 (float64 for double buffers), one
    lerp kernel (two with the correction). The five-kernel expression, twice, cost 16 us a BatchNorm2d call
    on an H100 (64x64x512x512 fp32: 4.274 -> 4.258 ms); torch fuses the update into its statistics kernel."""
    if running is None:
        return
    with torch.no_grad():
        if correction != 1.0:
            stat = stat * correction
        if running.dtype in (torch.float32, torch.float64):
            running.lerp_(stat.to(running.dtype), momentum)
        else:
            running.copy_(torch.lerp(running.float(), stat.float(), momentum))


def _by_given_stats(x, weight, bias, mean, var, eps, op: str, when: str):
    if mean is None or var is None:
        raise ValueError(f"fastnorm.{op}: running_mean and running_var must be given {when}")
    return call("batch_norm_eval", x, weight, bias, _kernel_dtype(mean, x), _kernel_dtype(var, x), float(eps))


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5, activation=None):
    """GroupNorm of x (N, C, *spatial), as torch.nn.functional.group_norm: statistics per sample over
    each group of C / num_groups channels and all spatial positions; weight and bias per channel.
    activation="silu" returns F.silu(group_norm(x, ...)) from the same kernel pass (applied in float32,
    float64 for float64 x, before the rounding to x's dtype); None (the default) is plain GroupNorm."""
    ext = fast_entry(x)
    if ext is not None and not x.is_cuda:  # CPU only until the CUDA build's entry has run on a GPU
        y = ext.try_group_norm(x, num_groups, weight, bias, eps, activation)
        if y is not None:
            return y
    act = activation_code(activation)
    check_channel_input(x, "group_norm", weight=weight, bias=bias)
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral):
        raise TypeError(f"fastnorm.group_norm: num_groups must be an int, got {num_groups!r}")
    if num_groups <= 0 or x.shape[1] % num_groups:
        raise ValueError(f"fastnorm.group_norm: num_groups={num_groups} must be positive and divide the "
                         f"{x.shape[1]} channels of input of size {list(x.shape)}")
    _check_values(x.shape[0] * x.shape[1] // num_groups * math.prod(x.shape[2:]), x, "value per channel",
                  "group_norm")
    if act:
        # Also without weight and bias: the LayerNorm kernels have no activation epilogue, and the family
        # kernels' two reads of x and one write beat a LayerNorm pass plus a separate SiLU pass (2 + 2).
        weight, bias = _kernel_dtype(weight, x), _kernel_dtype(bias, x)
        return call("group_norm", x, weight, bias, int(num_groups), float(eps), activation)[0]
    if weight is None and bias is None:  # a LayerNorm of each group: see _layer_norm_of_groups
        return _layer_norm_of_groups(x, int(num_groups), eps)
    weight, bias = _kernel_dtype(weight, x), _kernel_dtype(bias, x)
    return call("group_norm", x, weight, bias, int(num_groups), float(eps))[0]


def _layer_norm_of_groups(x, groups: int, eps: float):
    """Without per-channel parameters or running statistics, each group is one LayerNorm row: the
    LayerNorm kernels take it, one fused pass on CUDA (the family kernels read x twice) and their fused
    backward."""
    group_size = x.shape[1] // groups * math.prod(x.shape[2:])
    y = layer_norm(x.reshape(x.shape[0], groups, group_size), None, None, None, float(eps), dim=2)
    return y.view(x.shape)


def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5):
    """InstanceNorm of x (N, C, *spatial), as torch.nn.functional.instance_norm: statistics per sample
    and channel over the spatial positions. With use_input_stats, running_mean / running_var (when
    given) are updated in place by the mean over N of each instance's mean / unbiased variance;
    without, they are the statistics."""
    if running_mean is None and running_var is None and use_input_stats and (weight is not None or bias is not None):
        ext = fast_entry(x)
        # group_norm's entry with a group a channel; more than one spatial element, as _check_values asks
        if ext is not None and not x.is_cuda and x.dim() > 2 and x.shape[2:].numel() > 1:
            y = ext.try_group_norm(x, x.shape[1], weight, bias, eps, None)
            if y is not None:
                return y
    check_channel_input(x, "instance_norm", weight=weight, bias=bias, running_mean=running_mean,
                        running_var=running_var)
    weight, bias = _kernel_dtype(weight, x), _kernel_dtype(bias, x)
    if not use_input_stats:
        return _by_given_stats(x, weight, bias, running_mean, running_var, eps, "instance_norm",
                               "with use_input_stats=False")
    spatial = math.prod(x.shape[2:])
    _check_values(spatial, x, "spatial element when training", "instance_norm")
    if weight is None and bias is None and running_mean is None and running_var is None:
        return _layer_norm_of_groups(x, x.shape[1], eps)
    y, mean, var = call("group_norm", x, weight, bias, x.shape[1], float(eps))
    if x.numel():
        _update_running(running_mean, mean.mean(0), momentum)
        _update_running(running_var, var.mean(0), momentum, spatial / (spatial - 1))
    return y


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5):
    """BatchNorm of x (N, C, *spatial), as torch.nn.functional.batch_norm. Training: statistics per
    channel over N and the spatial positions, and running_mean / running_var (when given) updated in
    place with the batch mean / unbiased variance and `momentum`. Eval: the running statistics."""
    ext = fast_entry(x)
    if ext is not None and not x.is_cuda:
        y = ext.try_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        if y is not None:
            return y
    check_channel_input(x, "batch_norm", weight=weight, bias=bias, running_mean=running_mean,
                        running_var=running_var)
    weight, bias = _kernel_dtype(weight, x), _kernel_dtype(bias, x)
    if not training:
        if eps < 0:
            raise ValueError(f"fastnorm.batch_norm: eps must be non-negative, got {eps}")
        return _by_given_stats(x, weight, bias, running_mean, running_var, eps, "batch_norm",
                               "in evaluation mode (training=False)")
    count = x.shape[0] * math.prod(x.shape[2:])
    _check_values(count, x, "value per channel when training", "batch_norm")
    if eps <= 0:
        raise ValueError(f"fastnorm.batch_norm: eps must be positive when training, got {eps}")
    y, mean, var = call("batch_norm", x, weight, bias, float(eps))
    if x.numel():
        _update_running(running_mean, mean, momentum)
        _update_running(running_var, var, momentum, count / (count - 1))
    return y


def normalize(x, p: float = 2.0, dim=1, eps: float = 1e-12, *, mean: bool = False):
    """x / max(norm, eps), as torch.nn.functional.normalize, with the L1 (p=1) or L2 (p=2) norm over
    `dim`: an int, a tuple of consecutive dims, or None for all dims (the whole-tensor / Frobenius
    norm). mean=True takes the norm of the mean instead of the sum: mean(|x|) for p=1, sqrt(mean(x*x))
    for p=2. Other p go to torch.nn.functional.normalize (mean=False only)."""
    if p not in (1, 2):
        if mean:
            raise ValueError(f"fastnorm.normalize: mean=True needs p=1 or p=2, got p={p!r}")
        return F.normalize(x, p, dim, eps)
    begin, end = norm_dims(x, None, tuple(range(x.dim())) if dim is None else dim, "normalize")
    return call("p_normalize", x, float(p), begin, end, float(eps), bool(mean))
