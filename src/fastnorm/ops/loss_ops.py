"""The custom ops torch.ops.fastnorm.cross_entropy / cross_entropy_backward: softmax cross-entropy over the
classes of logits (rows, classes), the log-softmax normalization of each row and the negative log-likelihood
of its target class, computed in float32 (float64 for float64 logits) from the logits' own dtype.

cross_entropy returns the rows' losses reduced (none, sum or mean over the rows not ignored; on CUDA calls of
up to 32768 rows in the same launches), each row's log-sum-exp and the count of rows not ignored. A row whose
target is ignore_index has loss 0 and gradient 0; any other target outside [0, classes) gives NaN
(PyTorch's device assert would end the caller's process).
The backward reads the logits once more and writes their gradient, dloss * (softmax - onehot), in the
logits' dtype: with the forward's single read, no float32 copy of the logits (a language model's largest
tensor) is ever made. CUDA runs softmax_loss.cu; the CPU runs the same math in ATen's own ops.
"""
import torch

from fastnorm.ops import extension, norm_ops  # norm_ops defines the fastnorm library
from fastnorm.ops.norm_ops import accumulator_dtype
from fastnorm.ops.library_compat import register_autograd, register_fake

_lib = norm_ops._lib
# (out, lse, valid): the rows' losses reduced by `reduction` (REDUCTIONS' index: none, sum, mean), each row's
# log-sum-exp (the backward's) and the count of rows not ignored (the mean's divisor; unset without reduction).
_lib.define("cross_entropy(Tensor logits, Tensor target, int ignore_index, int reduction) -> (Tensor, Tensor, Tensor)")
_lib.define("cross_entropy_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, Tensor valid, "
            "int ignore_index, int reduction) -> Tensor")
REDUCTIONS = ("none", "sum", "mean")  # the kernels' CrossEntropyReduction codes, in order
_NONE, _SUM, _MEAN = range(3)


def _cpu_targets(logits, target, ignore_index):
    """(ignored rows, rows with a target out of range, targets with those replaced by class 0)."""
    ignored = target == ignore_index
    bad = ~ignored & ((target < 0) | (target >= logits.shape[1]))
    return ignored, bad, torch.where(ignored | bad, torch.zeros_like(target), target)


def cross_entropy_cpu(logits, target, ignore_index, reduction):
    x = logits.to(accumulator_dtype(logits.dtype))
    lse = torch.logsumexp(x, dim=1)
    ignored, bad, safe = _cpu_targets(logits, target, ignore_index)
    loss = lse - x.gather(1, safe.unsqueeze(1)).squeeze(1)
    loss = torch.where(bad, torch.full_like(loss, float("nan")), loss)
    loss = torch.where(ignored, torch.zeros_like(loss), loss)
    valid = (~ignored).sum().to(loss.dtype)
    if reduction == _NONE:
        return loss, lse, valid
    total = loss.sum()
    return (total / valid if reduction == _MEAN else total), lse, valid


def cross_entropy_backward_cpu(dloss, logits, target, lse, valid, ignore_index, reduction):
    ignored, bad, safe = _cpu_targets(logits, target, ignore_index)
    d = dloss.expand(lse.shape) if reduction != _NONE else dloss
    d = d / valid if reduction == _MEAN else d
    d = torch.where(ignored, torch.zeros_like(d), torch.where(bad, torch.full_like(d, float("nan")), d))
    grad = torch.exp(logits.to(lse.dtype) - lse.unsqueeze(1)) * d.unsqueeze(1)
    grad.scatter_add_(1, safe.unsqueeze(1), -d.unsqueeze(1))
    return grad.to(logits.dtype)


def cross_entropy_cuda(logits, target, ignore_index, reduction):
    out, lse, valid = extension.load("cuda").cross_entropy_forward(logits, target, ignore_index, reduction)
    return out, lse, valid  # the binding gives a list; the op's schema returns a tuple


def cross_entropy_backward_cuda(dloss, logits, target, lse, valid, ignore_index, reduction):
    return extension.load("cuda").cross_entropy_backward(dloss, logits, target, lse, valid, ignore_index, reduction)


_lib.impl("cross_entropy", cross_entropy_cpu, "CPU")
_lib.impl("cross_entropy_backward", cross_entropy_backward_cpu, "CPU")
_lib.impl("cross_entropy", cross_entropy_cuda, "CUDA")
_lib.impl("cross_entropy_backward", cross_entropy_backward_cuda, "CUDA")


@register_fake("fastnorm::cross_entropy")
def _cross_entropy_fake(logits, target, ignore_index, reduction):
    acc, rows = accumulator_dtype(logits.dtype), (logits.shape[0],)
    out = logits.new_empty(rows if reduction == _NONE else (), dtype=acc)
    return out, logits.new_empty(rows, dtype=acc), logits.new_empty((), dtype=acc)


@register_fake("fastnorm::cross_entropy_backward")
def _cross_entropy_backward_fake(dloss, logits, target, lse, valid, ignore_index, reduction):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, reduction = inputs
    ctx.ignore_index, ctx.reduction = ignore_index, reduction
    ctx.save_for_backward(logits, target, output[1], output[2])
    # lse and valid carry no gradient: None in the backward, not zero tensors allocated and filled each step
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)


def _backward(ctx, dloss, _dlse, _dvalid):  # lse and valid are the backward's, not differentiable
    logits, target, lse, valid = ctx.saved_tensors
    if dloss is None or not ctx.needs_input_grad[0]:
        return None, None, None, None
    dloss = dloss.to(lse.dtype).contiguous()
    dlogits = torch.ops.fastnorm.cross_entropy_backward(dloss, logits, target, lse, valid, ctx.ignore_index,
                                                        ctx.reduction)
    return dlogits, None, None, None


register_autograd(_lib, "fastnorm::cross_entropy", _backward, _setup_context)
