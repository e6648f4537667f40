"""Public functional API: torch.nn.functional semantics, plus normalization over any axis (`dim`)."""
import torch

from fastnorm.ops import extension, norm_ops, residual_ops  # they register torch.ops.fastnorm.*
from fastnorm.ops.direct import direct_call_ok
from fastnorm.ops.eager_autograd import function_call_ok, norm_autograd
from fastnorm.ops.validate import check_affine, check_residual, default_rms_eps, norm_dims

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_built = extension.loaded_modules()  # device type -> extension, filled as extensions load


def _records_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fast_entry(x):
    """The loaded extension that can take a call on x's device straight from C++, or None. Only an
    extension that is already loaded: the first call of a process takes the Python path, which
    validates the arguments before anything is built."""
    if _is_compiling() or type(x) is not _Tensor:  # this order: dynamo must not trace into C++
        return None
    return _built.get("cuda" if x.is_cuda else "cpu")


def layer_norm(x, normalized_shape=None, weight=None, bias=None, eps: float = 1e-5, *, dim=None, residual=None,
               residual_in_fp32=False):
    """LayerNorm of `x` over its trailing `normalized_shape` dims, or over the consecutive dims `dim`.

    Same semantics as torch.nn.functional.layer_norm; `dim=1` normalizes the channels of an NCHW tensor
    in place of the trailing dims (weight and bias then have shape x.shape[dim]).
    With `residual`: returns (y, h), h = x + residual (float32 with residual_in_fp32), y = layer_norm(h),
    fused in one kernel where it can be.
    """
    if residual is not None:
        begin, end = norm_dims(x, normalized_shape, dim, "layer_norm")
        check_affine(x, begin, end, "layer_norm", weight=weight, bias=bias)
        check_residual(x, residual, residual_in_fp32, "layer_norm")
        args = (x, residual, begin, end, weight, bias, float(eps), bool(residual_in_fp32))
        if direct_call_ok(x, residual, weight, bias):
            return residual_ops.add_layer_norm_kernel(*args)
        return torch.ops.fastnorm.add_layer_norm(*args)
    ext = fast_entry(x)
    if ext is not None:
        y = ext.try_layer_norm(x, normalized_shape, dim, weight, bias, eps)
        if y is not None:
            return y
    begin, end = norm_dims(x, normalized_shape, dim, "layer_norm")
    check_affine(x, begin, end, "layer_norm", weight=weight, bias=bias)
    if direct_call_ok(x, weight, bias):
        return norm_ops.layer_norm_kernel(x, begin, end, weight, bias, float(eps))
    if function_call_ok(x, weight, bias):
        return norm_autograd(x, weight, bias, begin, end, float(eps), False)
    if x.is_cuda and _records_grad(x, weight, bias):  # the backward reads the saved statistics
        return torch.ops.fastnorm.layer_norm_train(x, begin, end, weight, bias, float(eps))[0]
    return torch.ops.fastnorm.layer_norm(x, begin, end, weight, bias, float(eps))


def rms_norm(x, normalized_shape=None, weight=None, eps=None, *, dim=None, residual=None, residual_in_fp32=False):
    """RMSNorm: x / sqrt(mean(x**2) + eps) [* weight], over trailing dims or the consecutive dims `dim`.

    Same semantics as torch.nn.functional.rms_norm (eps None: as PyTorch computes it, float32's epsilon
    for float32, float16 and bfloat16, float64's for float64; see validate.default_rms_eps).
    With `residual`: returns (y, h), h = x + residual (float32 with residual_in_fp32), y = rms_norm(h),
    fused in one kernel where it can be.
    """
    if residual is not None:
        begin, end = norm_dims(x, normalized_shape, dim, "rms_norm")
        check_affine(x, begin, end, "rms_norm", weight=weight)
        check_residual(x, residual, residual_in_fp32, "rms_norm")
        eps = default_rms_eps(x.dtype) if eps is None else eps
        args = (x, residual, begin, end, weight, float(eps), bool(residual_in_fp32))
        if direct_call_ok(x, residual, weight):
            return residual_ops.add_rms_norm_kernel(*args)
        return torch.ops.fastnorm.add_rms_norm(*args)
    ext = fast_entry(x)
    if ext is not None:
        y = ext.try_rms_norm(x, normalized_shape, dim, weight, eps)
        if y is not None:
            return y
    begin, end = norm_dims(x, normalized_shape, dim, "rms_norm")
    check_affine(x, begin, end, "rms_norm", weight=weight)
    if eps is None:
        eps = default_rms_eps(x.dtype)
    if direct_call_ok(x, weight):
        return norm_ops.rms_norm_kernel(x, begin, end, weight, float(eps))
    if function_call_ok(x, weight):
        return norm_autograd(x, weight, None, begin, end, float(eps), True)
    if x.is_cuda and _records_grad(x, weight):  # the backward reads the saved statistics
        return torch.ops.fastnorm.rms_norm_train(x, begin, end, weight, float(eps))[0]
    return torch.ops.fastnorm.rms_norm(x, begin, end, weight, float(eps))
