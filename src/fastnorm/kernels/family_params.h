// Plain description of one call of the normalization family (GroupNorm, InstanceNorm, BatchNorm,
// L1 / L2 / Frobenius normalization), shared by the CPU and CUDA kernels. Free of PyTorch headers.
//
// Every member is the same two steps over a contiguous x:
// 1. statistics of `stats` sets of elements; set k is `runs` runs of `run_len` contiguous elements,
//    run j starting at element k * set_stride + j * run_stride:
//      GroupNorm (N, C, S), G groups: N * G sets, one run of C / G * S elements each;
//      BatchNorm (N, C, S): C sets, N runs of S elements, C * S apart;
//      p-norms of rows of n elements: one set per row; the whole tensor: one set;
// 2. y = (x - center) * scale + offset, with (center, scale, offset) per row of `row_len` elements:
//    row r uses coefficient c = r % coeffs, whose channel is ch = c % channels (weight[ch], bias[ch])
//    and whose statistics are set (c / channels) * groups + ch / (channels / groups).
//      GroupNorm: rows of S, N * C coefficients, C channels, G groups;
//      BatchNorm: rows of S, C coefficients, C channels, C groups;
//      p-norms: rows of n, one coefficient per row, 1 channel, 1 group.
#pragma once
#include <stdint.h>

#include "norm_params.h"  // FastnormDtype

// Statistic of a set: mean and biased variance (y = (x - mean) / sqrt(var + eps) * w + b), or the
// sum of |x| / of x^2 (y = x / max(norm, eps), norm = sum |x| or sqrt(sum x^2), each sum divided by
// the set's size first when p_mean is set).
enum FamilyStat { FN_STAT_MEAN_VAR = 0, FN_STAT_ABS_SUM = 1, FN_STAT_SQUARE_SUM = 2 };

// Activation applied to y in the output pass, in the accumulator dtype before the cast to x's dtype
// (GroupNorm -> SiLU of diffusion blocks in one pass): y = z * sigmoid(z), z the normalized value.
enum FamilyActivation { FN_ACT_NONE = 0, FN_ACT_SILU = 1 };

struct FamilyParams {
  const void* x;  // contiguous, `numel` elements of `dtype` (FastnormDtype)
  void* y;        // contiguous, same shape and dtype
  int dtype;
  int64_t numel;

  int stat;  // FamilyStat
  int64_t stats, set_stride, runs, run_stride, run_len;
  // Per set, in the accumulator dtype (float64 for float64 x, else float32). MEAN_VAR: mean and biased
  // variance, written, or read when given_stats is set (BatchNorm with running statistics). Sums: the
  // norm is written to `mean`; `var` is unused.
  void* mean;
  void* var;
  int given_stats;
  int p_mean;
  double eps;

  int64_t row_len, coeffs, channels, groups;
  const void* weight;  // `channels` values of wdtype each, or null
  const void* bias;
  int wdtype;  // FastnormDtype of weight / bias (x's dtype or the accumulator dtype), FN_NONE without
  int activation;  // FamilyActivation of the output

  // CUDA scratch (partial statistics and coefficients), sized by fastnorm_cuda_family_workspace_bytes.
  void* workspace;
  int64_t workspace_bytes;
};

// The backward of the affine members (GroupNorm / InstanceNorm, BatchNorm) over a contiguous x of shape
// (N, C, S), viewed as N * C planes of S elements. Each plane belongs to one set of statistics:
//   FN_BWD_GROUPS: set n * G + c / (C / G) (per-sample statistics, depending on x);
//   FN_BWD_BATCH: set c (batch statistics, depending on x);
//   FN_BWD_GIVEN: set c, statistics given (eval), so dx = dy' * weight * rstd.
// dy' is dy, or dy * silu'(z) with z = (x - mean) * rstd * weight + bias when the forward applied SiLU.
enum FamilyBackwardMode { FN_BWD_GROUPS = 0, FN_BWD_BATCH = 1, FN_BWD_GIVEN = 2 };

struct FamilyBackwardParams {
  const void* x;   // contiguous (N, C, S), `dtype` (FastnormDtype)
  const void* dy;  // contiguous, same shape and dtype
  void* dx;        // contiguous, same shape and dtype, or null (not needed)
  int dtype;
  int64_t n, channels, groups, spatial;
  int mode;  // FamilyBackwardMode
  const void* mean;  // per set, the accumulator dtype (float64 for float64 x, else float32)
  const void* var;   // biased variance per set
  double eps;
  const void* weight;  // `channels` values of wdtype each, or null
  const void* bias;    // read only with the SiLU activation
  int wdtype;
  int activation;  // FamilyActivation the forward applied
  void* dweight;   // `channels` values of the accumulator dtype each, or null (not needed)
  void* dbias;
  // CUDA scratch (per-piece sums, per-set coefficients), sized by fastnorm_cuda_family_backward_workspace_bytes.
  void* workspace;
  int64_t workspace_bytes;
};
