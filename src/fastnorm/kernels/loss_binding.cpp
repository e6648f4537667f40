// Tensor-level entry points of the CUDA softmax cross-entropy (softmax_loss.cu), bound by module.cpp:
// validate what the kernels rely on, describe the call as CrossEntropyParams, launch. CUDA build only
// (the CPU op is ATen's own ops, in ops/loss_ops.py); not part of single-file solutions.
#include <ATen/core/Tensor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <vector>

#include "binding.h"
#include "loss_params.h"

const char* fastnorm_cuda_cross_entropy(const CrossEntropyParams& p, bool backward, void* stream);

namespace {

// Checks logits (rows, classes) and target (rows,) and describes them; logits' classes must be contiguous.
CrossEntropyParams describe(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                            int64_t reduction, const char* op) {
  TORCH_CHECK(logits.dim() == 2, "fastnorm.", op, ": logits must be (rows, classes), got rank ", num(logits.dim()));
  TORCH_CHECK(logits.is_cuda(), "fastnorm.", op, ": this build runs CUDA tensors, got one on ", logits.device());
  const int code = dtype_code(logits.scalar_type());
  TORCH_CHECK(code != FN_NONE, "fastnorm.", op, ": unsupported logits dtype ", logits.scalar_type(),
              " (float32, float16, bfloat16 or float64)");
  TORCH_CHECK(logits.size(1) > 0 && logits.size(1) <= INT32_MAX, "fastnorm.", op, ": classes must be in [1, 2**31), got ",
              num(logits.size(1)));
  TORCH_CHECK(logits.size(0) <= INT32_MAX, "fastnorm.", op, ": at most 2**31 - 1 rows, got ", num(logits.size(0)));
  TORCH_CHECK(logits.size(1) == 1 || logits.stride(1) == 1, "fastnorm.", op, ": logits' classes must be contiguous");
  TORCH_CHECK(target.scalar_type() == at::kLong && target.dim() == 1 && target.size(0) == logits.size(0) &&
                  target.is_contiguous() && target.device() == logits.device(),
              "fastnorm.", op, ": target must be a contiguous int64 vector of ", num(logits.size(0)),
              " class indices on the logits' device");
  TORCH_CHECK(reduction >= FN_REDUCE_NONE && reduction <= FN_REDUCE_MEAN, "fastnorm.", op, ": bad reduction ",
              num(reduction));
  CrossEntropyParams p{};
  p.logits = logits.data_ptr();
  p.rows = logits.size(0);
  p.classes = logits.size(1);
  p.row_stride = logits.size(0) > 1 ? logits.stride(0) : p.classes;
  p.target = target.data_ptr<int64_t>();
  p.ignore_index = ignore_index;
  p.dtype = code;
  p.reduction = static_cast<int>(reduction);
  return p;
}

at::ScalarType acc_type(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void run(const CrossEntropyParams& p, bool backward) {
  const char* err = fastnorm_cuda_cross_entropy(p, backward, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == nullptr, "fastnorm cross-entropy kernel failed: ", err);
}

}  // namespace

std::vector<at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                              int64_t reduction) {
  CrossEntropyParams p = describe(logits, target, ignore_index, reduction, "cross_entropy");
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto options = logits.options().dtype(acc_type(logits));
  at::Tensor loss = at::empty({p.rows}, options), lse = at::empty({p.rows}, options);
  at::Tensor out = reduction == FN_REDUCE_NONE ? loss : at::empty({}, options);
  at::Tensor valid = at::empty({}, options);
  p.loss = loss.data_ptr();
  p.lse = lse.data_ptr();
  const bool in_kernel = reduction != FN_REDUCE_NONE && p.rows > 0 && p.rows <= kCrossEntropyReduceRows;
  if (in_kernel) {
    p.out = out.data_ptr();
    p.valid = valid.data_ptr();
  }
  run(p, false);
  if (reduction != FN_REDUCE_NONE && !in_kernel) {  // many rows (or none): ATen's sums, a fixed order too
    valid = at::sum(at::ne(target, ignore_index), acc_type(logits));
    out = at::sum(loss);
    if (reduction == FN_REDUCE_MEAN) out = at::div(out, valid);
  } else if (reduction == FN_REDUCE_NONE) {
    valid = at::full({}, NAN, options);  // the backward of no reduction does not read it
  }
  return {out, lse, valid};
}

at::Tensor cross_entropy_backward(const at::Tensor& dloss, const at::Tensor& logits, const at::Tensor& target,
                                  const at::Tensor& lse, const at::Tensor& valid, int64_t ignore_index,
                                  int64_t reduction) {
  CrossEntropyParams p = describe(logits, target, ignore_index, reduction, "cross_entropy_backward");
  const at::ScalarType acc = acc_type(logits);
  const int64_t dloss_numel = reduction == FN_REDUCE_NONE ? p.rows : 1;
  TORCH_CHECK(dloss.scalar_type() == acc && dloss.numel() == dloss_numel && dloss.is_contiguous() &&
                  lse.scalar_type() == acc && lse.dim() == 1 && lse.size(0) == p.rows && lse.is_contiguous() &&
                  valid.scalar_type() == acc && valid.numel() == 1,
              "fastnorm.cross_entropy_backward: dloss (", num(dloss_numel), " values), lse (", num(p.rows),
              ") and valid (1) must be contiguous ", c10::toString(acc));
  TORCH_CHECK(dloss.device() == logits.device() && lse.device() == logits.device() && valid.device() == logits.device(),
              "fastnorm.cross_entropy_backward: dloss, lse and valid must be on the logits' device");
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor dlogits = at::empty({p.rows, p.classes}, logits.options());
  p.lse = const_cast<void*>(lse.data_ptr());
  p.valid = const_cast<void*>(valid.data_ptr());
  p.dloss = dloss.data_ptr();
  p.dlogits = dlogits.data_ptr();
  run(p, true);
  return dlogits;
}
