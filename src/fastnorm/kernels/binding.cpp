// Tensor-level entry points shared by the CPU and the CUDA extension (and by single-file solutions):
// validate what the kernels rely on, describe the call as NormParams / NormBackwardParams, run the
// kernels. Compiled with FASTNORM_CUDA defined for the CUDA build. The Python module is module.cpp,
// kept apart: its headers take most of a build's time, and these per-operator ATen headers little.
#ifndef FASTNORM_INLINE  // the package's whole inline source starts with torch/extension.h, which has these
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#endif
#include <string>
#include <vector>

#include "binding.h"
#include "kernel_wants.h"  // FASTNORM_WANT_CHANNEL: padded channel rows read in place
#include "norm_backward_params.h"
#include "norm_params.h"

#ifdef FASTNORM_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
int64_t fastnorm_cuda_workspace_bytes(const NormParams& p, bool* zeroed);
bool fastnorm_cuda_saves_stats(const NormParams& p);
const char* fastnorm_cuda_forward(const NormParams& p, void* stream);
int64_t fastnorm_cuda_backward_workspace_bytes(const NormBackwardParams& p);
const char* fastnorm_cuda_backward(const NormBackwardParams& p, void* stream);
#else
const char* fastnorm_cpu_forward(const NormParams& p);
const char* fastnorm_cpu_backward(const NormBackwardParams& p);
#endif

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FN_F32;
    case at::kHalf: return FN_F16;
    case at::kBFloat16: return FN_BF16;
    case at::kDouble: return FN_F64;
    default: return FN_NONE;
  }
}

namespace {

// True when dims [begin, ndim) of x are laid out contiguously (size-1 dims may have any stride).
bool tail_contiguous(const at::Tensor& x, int64_t begin) {
  int64_t expected = 1;
  for (int64_t d = x.dim() - 1; d >= begin; --d) {
    if (x.size(d) != 1 && x.stride(d) != expected) return false;
    expected *= x.size(d);
  }
  return true;
}

// Stride between consecutive outer indices when dims [0, begin) collapse into one; -1 otherwise.
int64_t collapsed_outer_stride(const at::Tensor& x, int64_t begin, int64_t tail_numel) {
  int64_t stride = -1, span = 1;  // span: outer indices covered by dims inside the current one
  for (int64_t d = begin - 1; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (stride < 0) {
      stride = x.stride(d);
    } else if (x.stride(d) != stride * span) {
      return -1;
    }
    span *= x.size(d);
  }
  if (stride < 0) stride = tail_numel;     // a single outer index
  return stride >= tail_numel ? stride : -1;  // overlapping rows are not supported in place
}

// What a forward and a backward call share: the (outer, n, inner) view of x, its dtype code, and
// weight / bias as the kernels take them (n contiguous elements of x's dtype or the wide type).
struct NormCall {
  int64_t outer = 1, n = 1, inner = 1;
  int code = FN_NONE;
  at::Tensor w, b;
  at::ScalarType wtype = at::kFloat;
  bool has_params = false;
};

NormCall prepare_call(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                      const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim, bool rms) {
  NormCall c;
  const int64_t ndim = x.dim();
  TORCH_CHECK(0 <= begin_dim && begin_dim < end_dim && end_dim <= ndim, "fastnorm: bad dims [",
              num(begin_dim), ", ", num(end_dim), ") for a tensor of rank ", num(ndim));
  c.code = dtype_code(x.scalar_type());
  TORCH_CHECK(c.code != FN_NONE, "fastnorm: unsupported input dtype ", x.scalar_type(),
              " (float32, float16, bfloat16 or float64)");
#ifdef FASTNORM_CUDA
  TORCH_CHECK(x.is_cuda(), "fastnorm: this build runs CUDA tensors, got one on ", x.device());
#else
  TORCH_CHECK(x.is_cpu(), "fastnorm: this build runs CPU tensors, got one on ", x.device());
#endif
  for (int64_t d = 0; d < ndim; ++d) (d < begin_dim ? c.outer : d < end_dim ? c.n : c.inner) *= x.size(d);

  // Weight and bias: n contiguous elements, both of x's dtype or both float32 (float64 for double x).
  at::Tensor& w = c.w;
  at::Tensor& b = c.b;
  if (weight.has_value() && weight->defined()) w = *weight;
  if (bias.has_value() && bias->defined()) b = *bias;
  TORCH_CHECK(!(rms && b.defined()), "fastnorm: RMSNorm takes no bias");
  for (const at::Tensor* t : {&w, &b}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->numel() == c.n, "fastnorm: weight/bias has ", num(t->numel()), " elements, expected ", num(c.n));
    TORCH_CHECK(t->device() == x.device(), "fastnorm: weight/bias on ", t->device(), ", input on ",
                x.device());
    TORCH_CHECK(dtype_code(t->scalar_type()) != FN_NONE, "fastnorm: unsupported weight/bias dtype ",
                t->scalar_type());
  }
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  c.has_params = w.defined() || b.defined();
  if (c.has_params) {
    const at::Tensor& first = w.defined() ? w : b;
    const bool same = !(w.defined() && b.defined()) || w.scalar_type() == b.scalar_type();
    c.wtype = same && (first.scalar_type() == x.scalar_type() || first.scalar_type() == wide)
                  ? first.scalar_type() : wide;
    // Skip the no-op calls: each costs dispatcher time on every call of a small shape.
    for (at::Tensor* t : {&w, &b}) {
      if (!t->defined()) continue;
      if (t->scalar_type() != c.wtype) *t = t->to(c.wtype);
      if (!t->is_contiguous()) *t = t->contiguous();
    }
  }
  return c;
}

#if defined(FASTNORM_CUDA) && defined(FASTNORM_WANT_CHANNEL)
// The row stride of x's tail when it is rows of its last dim padded (x[..., :W] of a wider buffer, dims [begin, ndim)
// laid out contiguously but for the last dim's padding); 0 otherwise.
int64_t padded_row_stride(const at::Tensor& x, int64_t begin) {
  const int64_t last = x.dim() - 1;
  if (last <= begin || x.stride(last) != 1) return 0;
  int64_t row = 0, expected = 0;
  for (int64_t d = last - 1; d >= begin; --d) {
    if (x.size(d) == 1) continue;
    if (row == 0) row = expected = x.stride(d);
    if (x.stride(d) != expected) return 0;
    expected *= x.size(d);
  }
  return row > x.size(last) ? row : 0;
}
#endif

// x as the kernels read it: in place when its rows (outer indices) are evenly strided over a
// contiguous tail, else a contiguous copy; and the stride between outer indices. With row_stride (a
// channel call's forward), also in place over a tail of padded rows, their stride set there.
std::pair<at::Tensor, int64_t> strided_input(const at::Tensor& x, int64_t begin_dim, int64_t tail_numel,
                                             int64_t* row_stride = nullptr) {
  int64_t outer_stride = tail_contiguous(x, begin_dim) ? collapsed_outer_stride(x, begin_dim, tail_numel) : -1;
#if defined(FASTNORM_CUDA) && defined(FASTNORM_WANT_CHANNEL)
  if (outer_stride < 0 && row_stride) {
    const int64_t rs = padded_row_stride(x, begin_dim), w = x.size(x.dim() - 1);
    outer_stride = rs > 0 ? collapsed_outer_stride(x, begin_dim, tail_numel / w * rs) : -1;
    if (outer_stride >= 0) *row_stride = rs;
  }
#endif
  if (outer_stride < 0) return {x.contiguous(), tail_numel};
  return {x, outer_stride};
}

// The fields a forward and a backward call describe alike: x as the kernels read it, the weight, the
// (outer, n, inner) view, dtypes, norm and eps. P is NormParams or NormBackwardParams.
template <typename P>
void describe_call(P& p, const NormCall& c, const at::Tensor& xc, int64_t outer_stride, double eps, bool rms) {
  p.x = xc.data_ptr();
  p.weight = c.w.defined() ? c.w.data_ptr() : nullptr;
  p.outer = c.outer;
  p.n = c.n;
  p.inner = c.inner;
  p.x_outer_stride = outer_stride;
  p.dtype = c.code;
  p.wdtype = c.has_params ? dtype_code(c.wtype) : FN_NONE;
  p.rms = rms ? 1 : 0;
  p.eps = eps;
}

// The accumulator type of x's kernels: what saved statistics are stored in.
at::ScalarType accumulator_type(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// norm_forward; with `stats` (norm_forward_train) also the statistics tensor, filled where the CUDA row
// kernel takes the call.
at::Tensor forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                   int64_t begin_dim, int64_t end_dim, double eps, bool rms, int64_t threads, int64_t blocks_per_row,
                   at::Tensor* stats) {
  NormCall c = prepare_call(x, weight, bias, begin_dim, end_dim, rms);
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  if (stats) {
    const std::vector<int64_t> shape = c.inner == 1 ? std::vector<int64_t>{c.outer, 3} : std::vector<int64_t>{0};
    *stats = at::empty(shape, x.options().dtype(accumulator_type(x)));
  }
#else
  if (stats) *stats = at::empty({0}, x.options().dtype(accumulator_type(x)));
#endif
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return y;
  int64_t row_stride = 0;  // (the CUDA channel column kernel reads padded rows in place)
  const auto [xc, outer_stride] = strided_input(x, begin_dim, c.n * c.inner, c.inner > 1 ? &row_stride : nullptr);

  NormParams p{};
  describe_call(p, c, xc, outer_stride, eps, rms);
  if (row_stride > 0) p.x_row = x.size(x.dim() - 1), p.x_row_stride = row_stride;
  p.y = y.data_ptr();
  p.bias = c.b.defined() ? c.b.data_ptr() : nullptr;
  p.threads = static_cast<int>(threads);
  p.blocks_per_row = static_cast<int>(blocks_per_row);
#ifdef FASTNORM_CUDA
  if (stats && fastnorm_cuda_saves_stats(p)) p.stats = stats->data_ptr();
  at::Tensor workspace;
  bool ws_zeroed = true;
  const int64_t ws_bytes = fastnorm_cuda_workspace_bytes(p, &ws_zeroed);
  if (ws_bytes > 0) {
    // A zeroing launch costs about 2 us of a few-row call: only the kernels with counters get one.
    workspace = ws_zeroed ? at::zeros({ws_bytes}, x.options().dtype(at::kByte))
                          : at::empty({ws_bytes}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = ws_bytes;
  }
  const char* err = fastnorm_cuda_forward(p, c10::cuda::getCurrentCUDAStream().stream());
#ifdef FASTNORM_WANT_CHANNEL
  if (err != nullptr && std::string(err) == FASTNORM_PADDED_ROWS_NOT_TAKEN) {
    const at::Tensor contiguous = x.contiguous();
    p.x = contiguous.data_ptr(), p.x_outer_stride = c.n * c.inner, p.x_row = p.x_row_stride = 0;
    err = fastnorm_cuda_forward(p, c10::cuda::getCurrentCUDAStream().stream());
  }
#endif
#else
  const char* err = fastnorm_cpu_forward(p);
#endif
  TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
  return y;
}

}  // namespace

at::Tensor norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                        const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                        double eps, bool rms, int64_t threads, int64_t blocks_per_row) {
  return forward(x, weight, bias, begin_dim, end_dim, eps, rms, threads, blocks_per_row, nullptr);
}

// The forward of a call that records autograd: (y, stats). stats is (outer, 3) for last-dim CUDA calls
// (its shape follows the call's shape and device only, as the op's fake function says) and holds each
// row's affine map where the forward saves them (fastnorm_cuda_saves_stats); else it is unwritten, and
// norm_backward, asking the same question, recomputes them. The answer depends on shape and device
// only, so a backward whose x sits at another address than the forward's gets the same one. (0,)
// elsewhere.
std::vector<at::Tensor> norm_forward_train(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                           const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                                           double eps, bool rms) {
  at::Tensor stats;
  at::Tensor y = forward(x, weight, bias, begin_dim, end_dim, eps, rms, 0, 0, &stats);
  return {y, stats};
}

// Pre-norm residual blocks: h = x + residual (in x's dtype, or float32 with residual_in_fp32) and
// y = norm(h), returned as (y, h). One kernel on CUDA last-dim rows a block holds (x and residual
// read once, h and y written once); elsewhere h is added first and normalized by norm_forward.
std::vector<at::Tensor> add_norm_forward(const at::Tensor& x, const at::Tensor& residual,
                                         const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                                         int64_t begin_dim, int64_t end_dim, double eps, bool rms,
                                         bool residual_in_fp32) {
  NormCall c = prepare_call(x, weight, bias, begin_dim, end_dim, rms);
  TORCH_CHECK(residual.sizes() == x.sizes(), "fastnorm: residual has shape ", num(residual.sizes()), ", input ",
              num(x.sizes()));
  TORCH_CHECK(residual.device() == x.device(), "fastnorm: residual on ", residual.device(), ", input on ", x.device());
  const at::ScalarType hdtype = residual_in_fp32 && x.scalar_type() != at::kDouble ? at::kFloat : x.scalar_type();
  TORCH_CHECK(residual.scalar_type() == x.scalar_type() || residual.scalar_type() == hdtype,
              "fastnorm: residual dtype ", residual.scalar_type(), " must be the input's (", x.scalar_type(), ")",
              residual_in_fp32 ? " or float32" : "");
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  if (c.inner == 1 && x.numel() > 0) {
    const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor y = at::empty(x.sizes(), contiguous);
    at::Tensor h = at::empty(x.sizes(), contiguous.dtype(hdtype));
    const at::Tensor r = residual.to(hdtype).contiguous();
    const auto [xc, outer_stride] = strided_input(x, begin_dim, c.n);
    NormParams p{};
    describe_call(p, c, xc, outer_stride, eps, rms);  // (inner is 1 here)
    p.y = y.data_ptr();
    p.bias = c.b.defined() ? c.b.data_ptr() : nullptr;
    p.residual = r.data_ptr();
    p.h = h.data_ptr();
    p.hdtype = dtype_code(hdtype);
    const char* err = fastnorm_cuda_forward(p, c10::cuda::getCurrentCUDAStream().stream());
    if (err == nullptr) return {y, h};
    TORCH_CHECK(std::string(err) == FASTNORM_RESIDUAL_NOT_FUSED, "fastnorm kernel failed: ", err);
  }
#endif
  const at::Tensor h = at::add(x.to(hdtype), residual.to(hdtype));
  at::Tensor y = norm_forward(h, weight, bias, begin_dim, end_dim, eps, rms, 0, 0);
  if (y.scalar_type() != x.scalar_type()) y = y.to(x.scalar_type());
  return {y, h};
}

// Gradients of y = norm(x) [* weight + bias] given dy: (dx, dweight, dbias), each an empty tensor
// where not asked for. dweight / dbias come in the dtype the kernels use for the parameters (the
// caller casts them to the parameters' own). Bias is passed for its presence and dtype only.
// dx_add (optional, like x) is added to dx in the same pass: a residual block's h also gets the
// gradient of its later uses.
std::vector<at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                      const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                                      double eps, bool rms, bool need_dx, bool need_dweight, bool need_dbias,
                                      const c10::optional<at::Tensor>& dx_add, const c10::optional<at::Tensor>& stats) {
  NormCall c = prepare_call(x, weight, bias, begin_dim, end_dim, rms);
  TORCH_CHECK(dy.sizes() == x.sizes(), "fastnorm: grad has shape ", num(dy.sizes()), ", input ", num(x.sizes()));
  TORCH_CHECK(dy.scalar_type() == x.scalar_type(), "fastnorm: grad dtype ", dy.scalar_type(), ", input ",
              x.scalar_type());
  TORCH_CHECK(dy.device() == x.device(), "fastnorm: grad on ", dy.device(), ", input on ", x.device());
  TORCH_CHECK(!need_dweight || c.w.defined(), "fastnorm: dweight asked for without a weight");
  TORCH_CHECK(!need_dbias || c.b.defined(), "fastnorm: dbias asked for without a bias");
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
#endif
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor dx = need_dx ? at::empty(x.sizes(), contiguous) : at::empty({0}, x.options());
  const auto param_options = x.options().dtype(c.wtype);
  at::Tensor dw = need_dweight ? at::empty({c.n}, param_options) : at::empty({0}, param_options);
  at::Tensor db = need_dbias ? at::empty({c.n}, param_options) : at::empty({0}, param_options);
  if (x.numel() == 0 || !(need_dx || need_dweight || need_dbias)) {
    if (need_dweight) dw.zero_();
    if (need_dbias) db.zero_();
    return {dx, dw, db};
  }
  const auto [xc, outer_stride] = strided_input(x, begin_dim, c.n * c.inner);
  const at::Tensor dyc = dy.contiguous();
  at::Tensor add;
  if (need_dx && dx_add.has_value() && dx_add->defined()) {
    TORCH_CHECK(dx_add->sizes() == x.sizes() && dx_add->device() == x.device(), "fastnorm: dx_add must be like x");
    add = dx_add->to(x.scalar_type()).contiguous();
  }

  // LayerNorm over one element: y is the bias whatever x is, so dx is exactly dx_add (or 0). The CUDA
  // kernels' x - mean from the saved statistics is a few ulps of x, times rstd = 1/sqrt(eps).
  const bool dx_constant = need_dx && !rms && c.n == 1;

  NormBackwardParams p{};
  describe_call(p, c, xc, outer_stride, eps, rms);
  p.dy = dyc.data_ptr();
  p.dy_outer_stride = c.n * c.inner;
  p.dx = need_dx && !dx_constant ? dx.data_ptr() : nullptr;
#ifdef FASTNORM_CUDA
  p.dx_add = add.defined() && p.dx ? add.data_ptr() : nullptr;
#endif
  p.dweight = need_dweight ? dw.data_ptr() : nullptr;
  p.dbias = need_dbias ? db.data_ptr() : nullptr;
#ifdef FASTNORM_CUDA
  if (stats.has_value() && stats->defined() && stats->numel() == c.outer * 3 && c.inner == 1) {
    TORCH_CHECK(stats->scalar_type() == accumulator_type(x) && stats->is_contiguous() && stats->device() == x.device(),
                "fastnorm: saved statistics must be a contiguous ", accumulator_type(x), " tensor on ", x.device());
    NormParams f{};  // the forward this backward belongs to, as the binding described it
    describe_call(f, c, xc, outer_stride, eps, rms);
    f.bias = c.b.defined() ? c.b.data_ptr() : nullptr;
    if (fastnorm_cuda_saves_stats(f)) p.affine = stats->data_ptr();
  }
  at::Tensor workspace;
  const int64_t ws_bytes = fastnorm_cuda_backward_workspace_bytes(p);
  if (ws_bytes > 0) {
    workspace = at::empty({ws_bytes}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = ws_bytes;
  }
  const char* err = fastnorm_cuda_backward(p, c10::cuda::getCurrentCUDAStream().stream());
#else
  const char* err = fastnorm_cpu_backward(p);
  if (err == nullptr && add.defined() && p.dx) dx.add_(add);  // the CPU kernels leave the sum to ATen
#endif
  TORCH_CHECK(err == nullptr, "fastnorm backward kernel failed: ", err);
  if (dx_constant) {
    if (add.defined()) dx.copy_(add); else dx.zero_();
  }
  return {dx, dw, db};
}
