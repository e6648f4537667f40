// The tensor-level entry points of binding.cpp, bound to Python by module.cpp.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <type_traits>
#include <vector>

#include "norm_params.h"

// Numbers in error messages, as text made with std::to_string. Streaming an integer, a double or a shape
// into TORCH_CHECK's message (c10::str's ostringstream) crashed the process instead of raising on the
// H100 machine (an extension built with g++ 13 whose inline stream code met the older libstdc++ the
// process had loaded; any extension there, not only ours): no number reaches the stream as a number.
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
inline std::string num(T v) {
  return std::to_string(v);
}

inline std::string num(at::IntArrayRef v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// FastnormDtype of a tensor dtype, FN_NONE for the unsupported ones.
int dtype_code(at::ScalarType t);

at::Tensor norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                        const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                        double eps, bool rms, int64_t threads, int64_t blocks_per_row);

std::vector<at::Tensor> norm_forward_train(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                                           double eps, bool rms);

std::vector<at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                      const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                                      double eps, bool rms, bool need_dx, bool need_dweight, bool need_dbias,
                                      const c10::optional<at::Tensor>& dx_add, const c10::optional<at::Tensor>& stats);

std::vector<at::Tensor> add_norm_forward(const at::Tensor& x, const at::Tensor& residual,
                                         const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                                         int64_t begin_dim, int64_t end_dim, double eps, bool rms,
                                         bool residual_in_fp32);

// The normalization family (family_binding.cpp); semantics in ops/family_ops.py and FamilyParams.
// activation: FamilyActivation (0 none, 1 SiLU), applied to y in the same pass.
std::vector<at::Tensor> group_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, int64_t groups, double eps,
                                           int64_t activation);

std::vector<at::Tensor> batch_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mean,
                                           const c10::optional<at::Tensor>& var, double eps);

at::Tensor p_normalize(const at::Tensor& x, double p, int64_t begin_dim, int64_t end_dim, double eps, bool mean);

// (dx, dweight, dbias) of group_norm_forward (mode FN_BWD_GROUPS) or batch_norm_forward (FN_BWD_BATCH: batch
// statistics; FN_BWD_GIVEN: given ones) given dy and the forward's mean / var; dweight and dbias in the
// accumulator dtype, each undefined where not needed.
std::vector<at::Tensor> family_backward(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                        const c10::optional<at::Tensor>& bias, const at::Tensor& mean,
                                        const at::Tensor& var, int64_t groups, double eps, int64_t activation,
                                        int64_t mode, bool need_dx, bool need_dweight, bool need_dbias);

#ifdef FASTNORM_CUDA
// Softmax cross-entropy over the classes of logits (rows, classes) (loss_binding.cpp, CUDA only; semantics in
// loss_params.h): (out, lse, valid): the rows' losses reduced by `reduction` (CrossEntropyReduction), their
// log-sum-exp and the count of rows not ignored; and the gradient of the logits given out's gradient dloss.
std::vector<at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                              int64_t reduction);
at::Tensor cross_entropy_backward(const at::Tensor& dloss, const at::Tensor& logits, const at::Tensor& target,
                                  const at::Tensor& lse, const at::Tensor& valid, int64_t ignore_index,
                                  int64_t reduction);
#endif
