// Tensor-level entry points of the normalization family (GroupNorm / InstanceNorm, BatchNorm, L1 / L2 /
// Frobenius normalization): check the arguments, describe the call as FamilyParams (family_params.h),
// run the CPU or CUDA kernels. Compiled with FASTNORM_CUDA defined for the CUDA build; part of
// single-file solutions like binding.cpp.
#ifndef FASTNORM_INLINE
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#endif
#include <cmath>
#include <vector>

#include "binding.h"
#include "family_params.h"

#ifdef FASTNORM_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
int64_t fastnorm_cuda_family_workspace_bytes(const FamilyParams& p);
const char* fastnorm_cuda_family(const FamilyParams& p, void* stream);
const char* fastnorm_cuda_p_norm_rows(const FamilyParams& p, void* stream, bool* ran);
const char* fastnorm_cuda_group_chain(const FamilyParams& p, void* stream, int64_t* bytes);
int64_t fastnorm_cuda_family_backward_workspace_bytes(const FamilyBackwardParams& p);
const char* fastnorm_cuda_family_backward(const FamilyBackwardParams& p, void* stream);
#else
const char* fastnorm_cpu_family(const FamilyParams& p);
const char* fastnorm_cpu_family_backward(const FamilyBackwardParams& p);
#endif

namespace {

// x's dtype, device and layout checked, x made contiguous, y allocated; the statistics' dtype.
struct FamilyCall {
  at::Tensor x, y, w, b;
  at::ScalarType acc = at::kFloat;
  FamilyParams p{};
};

FamilyCall start_call(const at::Tensor& x, const char* op) {
  TORCH_CHECK(dtype_code(x.scalar_type()) != FN_NONE, "fastnorm.", op, ": unsupported input dtype ",
              x.scalar_type(), " (float32, float16, bfloat16 or float64)");
#ifdef FASTNORM_CUDA
  TORCH_CHECK(x.is_cuda(), "fastnorm.", op, ": this build runs CUDA tensors, got one on ", x.device());
#else
  TORCH_CHECK(x.is_cpu(), "fastnorm.", op, ": this build runs CPU tensors, got one on ", x.device());
#endif
  FamilyCall c;
  c.x = x.contiguous();
  c.y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  c.acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  c.p.x = c.x.data_ptr();
  c.p.y = c.y.data_ptr();
  c.p.dtype = dtype_code(x.scalar_type());
  c.p.numel = x.numel();
  c.p.wdtype = FN_NONE;
  c.p.channels = c.p.groups = 1;
  return c;
}

// A per-channel tensor (weight, bias, mean, var) of `channels` values on x's device, or undefined.
at::Tensor channel_tensor(const c10::optional<at::Tensor>& t, const at::Tensor& x, int64_t channels,
                          const char* what, const char* op) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  TORCH_CHECK(t->numel() == channels, "fastnorm.", op, ": ", what, " has ", num(t->numel()), " elements, expected ",
              num(channels), " (one per channel)");
  TORCH_CHECK(t->device() == x.device(), "fastnorm.", op, ": ", what, " on ", t->device(), ", input on ", x.device());
  TORCH_CHECK(dtype_code(t->scalar_type()) != FN_NONE, "fastnorm.", op, ": unsupported ", what, " dtype ",
              t->scalar_type());
  return *t;
}

// Weight and bias as the kernels read them: contiguous, both of x's dtype or both of the accumulator's.
// Their FastnormDtype, FN_NONE without either.
int affine_params(const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, const at::Tensor& x,
                  at::ScalarType acc, int64_t channels, const char* op, at::Tensor& w, at::Tensor& b) {
  w = channel_tensor(weight, x, channels, "weight", op);
  b = channel_tensor(bias, x, channels, "bias", op);
  if (!w.defined() && !b.defined()) return FN_NONE;
  const at::ScalarType first = (w.defined() ? w : b).scalar_type();
  const bool same = !(w.defined() && b.defined()) || w.scalar_type() == b.scalar_type();
  const at::ScalarType wtype = same && (first == x.scalar_type() || first == acc) ? first : acc;
  for (at::Tensor* t : {&w, &b}) {
    if (t->defined()) *t = t->to(wtype).contiguous();
  }
  return dtype_code(wtype);
}

void set_affine(FamilyCall& c, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                int64_t channels, const char* op) {
  c.p.wdtype = affine_params(weight, bias, c.x, c.acc, channels, op, c.w, c.b);
  c.p.weight = c.w.defined() ? c.w.data_ptr() : nullptr;
  c.p.bias = c.b.defined() ? c.b.data_ptr() : nullptr;
}

#ifdef FASTNORM_CUDA
// CUDA scratch of `bytes` for the call's kernels (none for 0), alive as long as the returned tensor.
at::Tensor attach_workspace(FamilyCall& c, int64_t bytes) {
  if (bytes == 0) return at::Tensor();
  at::Tensor workspace = at::empty({bytes}, c.x.options().dtype(at::kByte));
  c.p.workspace = workspace.data_ptr();
  c.p.workspace_bytes = bytes;
  return workspace;
}
#endif

void run_family(FamilyCall& c) {
  if (c.p.numel == 0) return;
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(c.x.device());
  const at::Tensor workspace = attach_workspace(c, fastnorm_cuda_family_workspace_bytes(c.p));
  const char* err = fastnorm_cuda_family(c.p, c10::cuda::getCurrentCUDAStream().stream());
#else
  const char* err = fastnorm_cpu_family(c.p);
#endif
  TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
}

#ifdef FASTNORM_CUDA
// GroupNorm sets that fit L2 a few at a time: one kernel, x mostly read once (family_chain_kernel.cuh). False:
// not such a call.
bool run_group_chain(FamilyCall& c) {
  if (c.p.numel == 0) return false;
  const c10::cuda::OptionalCUDAGuard guard(c.x.device());
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  int64_t bytes = 0;
  fastnorm_cuda_group_chain(c.p, stream, &bytes);
  if (bytes == 0) return false;
  const at::Tensor workspace = attach_workspace(c, bytes);
  const char* err = fastnorm_cuda_group_chain(c.p, stream, &bytes);
  TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
  return true;
}
#endif

// (N, C, spatial size) of an input of shape (N, C, *).
std::vector<int64_t> batch_channel_spatial(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() >= 2, "fastnorm.", op, ": expected an input of shape (N, C, *), got ", num(x.sizes()));
  const int64_t n = x.size(0), ch = x.size(1);
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  return {n, ch, spatial};
}

}  // namespace

std::vector<at::Tensor> group_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, int64_t groups, double eps,
                                           int64_t activation) {
  const char* op = "group_norm";
  const auto ncs = batch_channel_spatial(x, op);
  const int64_t n = ncs[0], ch = ncs[1], spatial = ncs[2];
  TORCH_CHECK(groups > 0 && ch % groups == 0, "fastnorm.group_norm: ", num(groups), " groups do not divide ", num(ch),
              " channels");
  TORCH_CHECK(activation == FN_ACT_NONE || activation == FN_ACT_SILU, "fastnorm.group_norm: activation code ",
              num(activation), " is not 0 (none) or 1 (silu)");
  FamilyCall c = start_call(x, op);
  set_affine(c, weight, bias, ch, op);
  at::Tensor mean = at::empty({n, groups}, x.options().dtype(c.acc));
  at::Tensor var = at::empty({n, groups}, x.options().dtype(c.acc));
  if (x.numel() == 0 && mean.numel() > 0) {  // groups of no elements: statistics of nothing
    mean.fill_(NAN);
    var.fill_(NAN);
  }
  FamilyParams& p = c.p;
  p.stat = FN_STAT_MEAN_VAR;
  p.stats = n * groups;
  p.run_len = p.set_stride = ch / groups * spatial;
  p.runs = 1;
  p.run_stride = 0;
  p.mean = mean.data_ptr();
  p.var = var.data_ptr();
  p.eps = eps;
  p.row_len = spatial;
  p.coeffs = n * ch;
  p.channels = ch;
  p.groups = groups;
  p.activation = int(activation);
#ifdef FASTNORM_CUDA
  if (run_group_chain(c)) return {c.y, mean, var};
#endif
  run_family(c);
  return {c.y, mean, var};
}

std::vector<at::Tensor> batch_norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& mean,
                                           const c10::optional<at::Tensor>& var, double eps) {
  const char* op = "batch_norm";
  const auto ncs = batch_channel_spatial(x, op);
  const int64_t n = ncs[0], ch = ncs[1], spatial = ncs[2];
  FamilyCall c = start_call(x, op);
  set_affine(c, weight, bias, ch, op);
  at::Tensor m = channel_tensor(mean, c.x, ch, "mean", op);
  at::Tensor v = channel_tensor(var, c.x, ch, "var", op);
  TORCH_CHECK(m.defined() == v.defined(), "fastnorm.batch_norm: give both mean and var, or neither");
  FamilyParams& p = c.p;
  p.given_stats = m.defined() ? 1 : 0;
  if (p.given_stats) {
    m = m.to(c.acc).contiguous();
    v = v.to(c.acc).contiguous();
  } else {
    m = at::empty({ch}, x.options().dtype(c.acc));
    v = at::empty({ch}, x.options().dtype(c.acc));
    if (x.numel() == 0 && ch > 0) {
      m.fill_(NAN);
      v.fill_(NAN);
    }
  }
  p.stat = FN_STAT_MEAN_VAR;
  p.stats = ch;
  p.set_stride = spatial;
  p.runs = n;
  p.run_stride = ch * spatial;
  p.run_len = spatial;
  p.mean = m.data_ptr();
  p.var = v.data_ptr();
  p.eps = eps;
  p.row_len = spatial;
  p.coeffs = ch;
  p.channels = ch;
  p.groups = ch;
  run_family(c);
  if (p.given_stats) return {c.y, *mean, *var};
  return {c.y, m, v};
}

at::Tensor p_normalize(const at::Tensor& x, double p_order, int64_t begin_dim, int64_t end_dim, double eps,
                       bool mean) {
  const char* op = "normalize";
  TORCH_CHECK(p_order == 1.0 || p_order == 2.0, "fastnorm.normalize: p must be 1 or 2, got ", num(p_order));
  const int64_t ndim = x.dim();
  TORCH_CHECK(0 <= begin_dim && begin_dim < end_dim && end_dim <= ndim, "fastnorm.normalize: bad dims [",
              num(begin_dim), ", ", num(end_dim), ") for a tensor of rank ", num(ndim));
  TORCH_CHECK(eps >= 0.0, "fastnorm.normalize: eps must be >= 0, got ", num(eps));
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < ndim; ++d) (d < begin_dim ? outer : d < end_dim ? n : inner) *= x.size(d);
  if (inner > 1) {
    // Norms across an inner axis: normalize rows of the transposed view, then put the axes back.
    // (Two extra copies: a strided statistics pass is future work.)
    const at::Tensor rows = x.reshape({outer, n, inner}).transpose(1, 2);
    const at::Tensor y = p_normalize(rows, p_order, 2, 3, eps, mean);
    return y.transpose(1, 2).contiguous().view(x.sizes());
  }
  FamilyCall c = start_call(x, op);
  at::Tensor norms = at::empty({outer}, x.options().dtype(c.acc));
  FamilyParams& p = c.p;
  p.stat = p_order == 1.0 ? FN_STAT_ABS_SUM : FN_STAT_SQUARE_SUM;
  p.p_mean = mean ? 1 : 0;
  p.stats = outer;
  p.run_len = p.set_stride = n;
  p.runs = 1;
  p.mean = norms.data_ptr();
  p.eps = eps;
  p.row_len = n;
  p.coeffs = outer;
#ifdef FASTNORM_CUDA
  if (p.numel > 0) {  // rows that fit L2 a wave at a time: one kernel, x read once
    const c10::cuda::OptionalCUDAGuard guard(c.x.device());
    bool ran = false;
    const char* err = fastnorm_cuda_p_norm_rows(p, c10::cuda::getCurrentCUDAStream().stream(), &ran);
    TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
    if (ran) return c.y;
  }
#endif
  run_family(c);
  return c.y;
}

std::vector<at::Tensor> family_backward(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                        const c10::optional<at::Tensor>& bias, const at::Tensor& mean,
                                        const at::Tensor& var, int64_t groups, double eps, int64_t activation,
                                        int64_t mode, bool need_dx, bool need_dweight, bool need_dbias) {
  const char* op = "family_backward";
  const auto ncs = batch_channel_spatial(x, op);
  const int64_t n = ncs[0], ch = ncs[1], spatial = ncs[2];
  TORCH_CHECK(dy.sizes() == x.sizes(), "fastnorm.", op, ": dy has shape ", num(dy.sizes()), ", x ", num(x.sizes()));
  TORCH_CHECK(dy.scalar_type() == x.scalar_type() && dy.device() == x.device(), "fastnorm.", op,
              ": dy and x must share dtype and device");
  TORCH_CHECK(dtype_code(x.scalar_type()) != FN_NONE, "fastnorm.", op, ": unsupported input dtype ", x.scalar_type());
  TORCH_CHECK(mode == FN_BWD_GROUPS || mode == FN_BWD_BATCH || mode == FN_BWD_GIVEN, "fastnorm.", op, ": bad mode ",
              num(mode));
  TORCH_CHECK(activation == FN_ACT_NONE || activation == FN_ACT_SILU, "fastnorm.", op, ": bad activation ",
              num(activation));
  const int64_t g = mode == FN_BWD_GROUPS ? groups : ch;
  TORCH_CHECK(g > 0 && ch % g == 0, "fastnorm.", op, ": ", num(g), " groups do not divide ", num(ch), " channels");
  const int64_t sets = mode == FN_BWD_GROUPS ? n * g : ch;
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(mean.numel() == sets && var.numel() == sets, "fastnorm.", op, ": mean and var need ", num(sets),
              " values, got ", num(mean.numel()), " and ", num(var.numel()));
  TORCH_CHECK(mean.device() == x.device() && var.device() == x.device(), "fastnorm.", op, ": mean and var on ",
              mean.device(), " / ", var.device(), ", x on ", x.device());
  FamilyBackwardParams p{};
  at::Tensor w, b;
  p.wdtype = affine_params(weight, bias, x, acc, ch, op, w, b);
  at::Tensor dx, dweight, dbias;
#ifdef FASTNORM_CUDA
  TORCH_CHECK(x.is_cuda(), "fastnorm.", op, ": this build runs CUDA tensors, got one on ", x.device());
#else
  TORCH_CHECK(x.is_cpu(), "fastnorm.", op, ": this build runs CPU tensors, got one on ", x.device());
#endif
  const at::Tensor xc = x.contiguous(), dyc = dy.contiguous();
  const at::Tensor m = mean.to(acc).contiguous(), v = var.to(acc).contiguous();
  if (need_dx) dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (need_dweight) dweight = at::empty({ch}, x.options().dtype(acc));
  if (need_dbias) dbias = at::empty({ch}, x.options().dtype(acc));
  if (x.numel() == 0) {
    if (need_dweight) dweight.zero_();
    if (need_dbias) dbias.zero_();
    return {dx, dweight, dbias};
  }
  p.x = xc.data_ptr();
  p.dy = dyc.data_ptr();
  p.dx = need_dx ? dx.data_ptr() : nullptr;
  p.dtype = dtype_code(x.scalar_type());
  p.n = n;
  p.channels = ch;
  p.groups = g;
  p.spatial = spatial;
  p.mode = int(mode);
  p.mean = m.data_ptr();
  p.var = v.data_ptr();
  p.eps = eps;
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.activation = int(activation);
  p.dweight = need_dweight ? dweight.data_ptr() : nullptr;
  p.dbias = need_dbias ? dbias.data_ptr() : nullptr;
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor workspace;
  const int64_t bytes = fastnorm_cuda_family_backward_workspace_bytes(p);
  if (bytes > 0) {
    workspace = at::empty({bytes}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = bytes;
  }
  const char* err = fastnorm_cuda_family_backward(p, c10::cuda::getCurrentCUDAStream().stream());
#else
  const char* err = fastnorm_cpu_family_backward(p);
#endif
  TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
  return {dx, dweight, dbias};
}
