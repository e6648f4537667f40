// Plain description of one normalization call, shared by the CPU and CUDA kernels.
// Deliberately free of PyTorch headers so that kernel sources compile fast.
//
// x is viewed as (outer, n, inner): the statistics of each (o, i) pair are taken over the n
// elements j = 0..n-1, which sit `inner` elements apart. inner == 1 is the usual last-dim norm;
// inner > 1 is a norm over a non-trailing axis (e.g. the channels of an NCHW tensor).
// Element (o, j, i) of x is at x[o * x_outer_stride + j * inner + i]; y is contiguous.
// Weight and bias, when present, hold n contiguous elements indexed by j.
#pragma once
#include <stdint.h>

enum FastnormDtype { FN_F32 = 0, FN_F16 = 1, FN_BF16 = 2, FN_F64 = 3, FN_NONE = -1 };

struct NormParams {
  const void* x;
  void* y;
  const void* weight;  // may be null
  const void* bias;    // may be null (always null for RMSNorm)
  int64_t outer;
  int64_t n;
  int64_t inner;
  int64_t x_outer_stride;
  int dtype;   // FastnormDtype of x and y
  int wdtype;  // FastnormDtype of weight and bias, FN_NONE when neither is given
  int rms;     // 1: y = x * rsqrt(mean(x^2) + eps) [* w];  0: LayerNorm
  double eps;
  // Tuning overrides, 0 = let the planner choose.
  int threads;         // threads per block
  int blocks_per_row;  // CUDA split-row kernel: blocks cooperating on one row
  // Scratch space for the CUDA split-row kernel, zero-filled by the caller.
  void* workspace;
  int64_t workspace_bytes;
  // Fused residual add (pre-norm blocks): when `residual` is set, h = x + residual is written to `h`
  // and normalized instead of x. Both contiguous (outer, n), of dtype `hdtype` (x's or float32).
  // Kernels that cannot fuse it return kResidualNotFused, and the caller adds first.
  const void* residual;
  void* h;
  int hdtype;
  // Training (CUDA): where the row, offset-row or thread-row kernel saves each row's affine map (center,
  // offset, rstd: see Affine in cuda_stats.cuh), [outer][3] in the accumulator type, for the backward
  // to read instead of recomputing the statistics. Set only where fastnorm_cuda_saves_stats says one of
  // them takes the call; any other kernel answers an error rather than leave it unwritten.
  void* stats;
  // Channel calls (inner > 1) over a view whose last dim is padded (x[..., :W] of a wider buffer): the tail is rows
  // of x_row = W elements x_row_stride apart; 0 where it is contiguous. Kernels that do not read x so return
  // FASTNORM_PADDED_ROWS_NOT_TAKEN, and the caller passes a contiguous copy.
  int64_t x_row, x_row_stride;
};

// What a forward returns when it does not fuse the residual add for this call.
#define FASTNORM_RESIDUAL_NOT_FUSED "residual add not fused for this call"
// What a forward returns when its kernel does not read x's padded rows in place (NormParams::x_row_stride).
#define FASTNORM_PADDED_ROWS_NOT_TAKEN "padded rows not read in place for this call"
