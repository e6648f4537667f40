"""The fused normalization helpers that a generated solution file carries.

They are ordinary functions so they can be tested here; `fastnorm solve` copies the source of the
ones a solution uses into its file (with the private functions they call, see `required`), where
`_ext` is the load_inline module and THREADS / BLOCKS_PER_ROW hold the launch configuration the
solver chose. The rewritten graph calls them by identity, which is how the code generator knows where
they are used. A solution builds only the functions of `_ext` its helpers call (extension_calls); the
solver narrows that to the calls they make on the traced shapes (extension_calls.py, kernel_needs.py).

Each helper has the semantics of the PyTorch function or module it replaces, including the in-place
update of running statistics (BatchNorm, InstanceNorm) that the kernels leave to the Python side.
"""
import torch

_ext = None  # set by the solution file (its load_inline module) or by tests
THREADS = 0  # launch overrides passed to every norm_forward call; 0 = the kernel's own choice
BLOCKS_PER_ROW = 0


def _dim_range(x, dim, what):
    """(begin, end) of the consecutive dims `dim` of x: one dim, a sequence of them, or None / () for all."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        dim = range(x.dim())
    dims = sorted(d % x.dim() for d in ((dim,) if isinstance(dim, int) else dim))
    begin, end = dims[0], dims[-1] + 1
    if dims != list(range(begin, end)):
        raise ValueError(f"{what}: dims {tuple(dims)} are not consecutive")
    return begin, end


def _blend_into(running, batch, momentum):
    """running = (1 - momentum) * running + momentum * batch in place, as torch updates running statistics:
    in float32 (float64 for double buffers), one lerp kernel."""
    with torch.no_grad():
        if running.dtype in (torch.float32, torch.float64):
            running.lerp_(batch.to(running.dtype), momentum)
        else:
            running.copy_(torch.lerp(running.float(), batch.float(), momentum))


def _values_per_channel(x):
    """Elements of each channel of (N, C, *spatial) x over the batch: N * prod(spatial)."""
    count = x.shape[0]
    for size in x.shape[2:]:
        count *= size
    return count


def fused_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps) on the inline kernel."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    begin = x.dim() - len(normalized_shape)
    if begin < 0 or tuple(x.shape[begin:]) != tuple(normalized_shape):
        raise ValueError(f"layer_norm: normalized_shape {tuple(normalized_shape)} is not the end of "
                         f"the input shape {tuple(x.shape)}")
    return _ext.norm_forward(x, weight, bias, begin, x.dim(), float(eps), False, THREADS, BLOCKS_PER_ROW)


def fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm(x, normalized_shape, weight, eps) on the inline kernel."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    begin = x.dim() - len(normalized_shape)
    if begin < 0 or tuple(x.shape[begin:]) != tuple(normalized_shape):
        raise ValueError(f"rms_norm: normalized_shape {tuple(normalized_shape)} is not the end of "
                         f"the input shape {tuple(x.shape)}")
    if eps is None:  # as F.rms_norm computes it: the accumulator type's epsilon (float32's for half types)
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    return _ext.norm_forward(x, weight, None, begin, x.dim(), float(eps), True, THREADS, BLOCKS_PER_ROW)


def fused_rms_norm_over_dims(x, dim, weight=None, eps=0.0):
    """x / sqrt(mean(x**2, dim, keepdim=True) + eps) [* weight] on the inline kernel.

    `dim`: one dim or consecutive dims (None: all of them). `weight`: one value per normalized element,
    in any shape that broadcasts along the normalized dims only (e.g. (C, 1, 1) for dim=1 of NCHW).
    """
    begin, end = _dim_range(x, dim, "rms_norm")
    return _ext.norm_forward(x, weight, None, begin, end, float(eps), True, THREADS, BLOCKS_PER_ROW)


def fused_layer_norm_over_dims(x, dim, weight=None, bias=None, eps=0.0):
    """(x - mean) / sqrt(biased var + eps) [* weight] [+ bias] over the consecutive dims `dim` of x (None:
    all) on the inline kernel. weight / bias: one value per normalized element, in any shape that
    broadcasts along the normalized dims only."""
    begin, end = _dim_range(x, dim, "layer_norm")
    return _ext.norm_forward(x, weight, bias, begin, end, float(eps), False, THREADS, BLOCKS_PER_ROW)


def fused_batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                     eps=1e-5):
    """torch.nn.functional.batch_norm on the inline kernel: in training, the batch's statistics, with the
    running ones (when given) updated in place from them (unbiased variance) as torch does; otherwise
    the running statistics."""
    if not training:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var must be given when not training")
        return _ext.batch_norm_forward(x, weight, bias, running_mean, running_var, float(eps))[0]
    if eps <= 0.0:
        raise ValueError(f"batch_norm eps must be positive during training, but got {eps}")
    count = _values_per_channel(x) if x.dim() >= 2 else 0
    if count == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    y, mean, var = _ext.batch_norm_forward(x, weight, bias, None, None, float(eps))
    if running_mean is not None:
        _blend_into(running_mean, mean, momentum)
    if running_var is not None:
        _blend_into(running_var, var * (count / max(count - 1, 1)), momentum)
    return y


def fused_batch_norm_module(x, module):
    """module(x) for an nn.BatchNorm1d / 2d / 3d, as its forward: training counts num_batches_tracked and
    moves the running statistics by `momentum` (None: cumulative average); eval normalizes by them."""
    factor = 0.0 if module.momentum is None else module.momentum
    if module.training and module.track_running_stats and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        if module.momentum is None:
            factor = 1.0 / float(module.num_batches_tracked)
    use_batch_stats = module.training or (module.running_mean is None and module.running_var is None)
    pass_running = not module.training or module.track_running_stats
    return fused_batch_norm(x, module.running_mean if pass_running else None,
                            module.running_var if pass_running else None, module.weight, module.bias,
                            use_batch_stats, factor, module.eps)


def fused_instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                        momentum=0.1, eps=1e-5):
    """torch.nn.functional.instance_norm on the inline kernels: statistics of each sample's channel (the
    running ones, when given, updated in place with their mean over the batch), or the running
    statistics when use_input_stats is False."""
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise ValueError("instance_norm: running_mean and running_var must be given when use_input_stats "
                             "is False")
        return _ext.batch_norm_forward(x, weight, bias, running_mean, running_var, float(eps))[0]
    spatial = _values_per_channel(x) // max(x.shape[0], 1) if x.dim() >= 2 else 0
    if spatial == 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(x.shape)}")
    if weight is None and bias is None and running_mean is None and running_var is None:
        return fused_group_norm(x, x.shape[1], None, None, eps)  # each plane one LayerNorm row
    y, mean, var = _ext.group_norm_forward(x, weight, bias, x.shape[1], float(eps), 0)
    if running_mean is not None:
        _blend_into(running_mean, mean.mean(0), momentum)
    if running_var is not None:
        _blend_into(running_var, (var * (spatial / max(spatial - 1, 1))).mean(0), momentum)
    return y


def fused_instance_norm_module(x, module):
    """module(x) for an nn.InstanceNorm1d / 2d / 3d on the inline kernels, as its forward (an input
    without the batch dim is one sample)."""
    batched_dims = {torch.nn.InstanceNorm1d: 3, torch.nn.InstanceNorm2d: 4, torch.nn.InstanceNorm3d: 5}
    unbatched = any(isinstance(module, cls) and x.dim() == dims - 1 for cls, dims in batched_dims.items())
    y = fused_instance_norm(x.unsqueeze(0) if unbatched else x, module.running_mean, module.running_var,
                            module.weight, module.bias, module.training or not module.track_running_stats,
                            module.momentum if module.momentum is not None else 0.0, module.eps)
    return y.squeeze(0) if unbatched else y


def fused_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, activation=None):
    """torch.nn.functional.group_norm(x, num_groups, weight, bias, eps) on the inline kernel, then
    torch.nn.functional.silu where activation is "silu" (in the kernel's output pass). Without weight,
    bias and activation each group is one LayerNorm row, which the LayerNorm kernels read once (the
    family kernels read x twice)."""
    groups = int(num_groups)
    if activation is None and weight is None and bias is None and x.dim() >= 2 and groups > 0 and x.shape[1] % groups == 0:
        group_size = x.numel() // max(x.shape[0] * groups, 1)
        rows = x.reshape(x.shape[0], groups, group_size)
        return _ext.norm_forward(rows, None, None, 2, 3, float(eps), False, THREADS, BLOCKS_PER_ROW).view(x.shape)
    return _ext.group_norm_forward(x, weight, bias, groups, float(eps), 1 if activation == "silu" else 0)[0]


def fused_normalize(x, p=2.0, dim=1, eps=1e-12, mean=False):
    """x / max(norm, eps) with the p-norm (p 1 or 2) over the consecutive dims `dim` of x (None: all of
    them, the Frobenius norm for p 2) on the inline kernel: torch.nn.functional.normalize(x, p, dim, eps).
    mean=True divides the sum by the count first (mean |x|, root mean square). Another p (read from an
    attribute at run time) takes torch.nn.functional.normalize itself."""
    if float(p) not in (1.0, 2.0):
        if mean:
            raise ValueError(f"normalize: mean=True needs p 1 or 2, got {p}")
        return torch.nn.functional.normalize(x, float(p), dim, eps)
    begin, end = _dim_range(x, dim, "normalize")
    return _ext.p_normalize(x, float(p), begin, end, float(eps), bool(mean))


HELPERS = {f.__name__: f for f in (fused_layer_norm, fused_rms_norm, fused_rms_norm_over_dims,
                                   fused_layer_norm_over_dims, fused_batch_norm, fused_batch_norm_module,
                                   fused_instance_norm, fused_instance_norm_module, fused_group_norm,
                                   fused_normalize)}
# The private functions helpers call, copied along with them.
SUPPORT = {f.__name__: f for f in (_dim_range, _blend_into, _values_per_channel)}
_ALL = {**SUPPORT, **HELPERS}


def required(helper_names) -> list:
    """The functions a solution calling `helper_names` must carry: those helpers, the helpers and private
    functions they call (transitively), in the order of this file."""
    needed, pending = set(), list(helper_names)
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        pending.extend(n for n in _ALL[name].__code__.co_names if n in _ALL)
    return [n for n in _ALL if n in needed]


def extension_calls(helper_names, available) -> list:
    """The functions of `_ext` (of those `available`, in their order) that a solution calling
    `helper_names` uses: its load_inline `functions=` list."""
    names = {n for f in required(helper_names) for n in _ALL[f].__code__.co_names}
    return [f for f in available if f in names]
