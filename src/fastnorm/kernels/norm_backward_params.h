// Plain description of one normalization backward call, shared by the CPU and CUDA kernels (no
// PyTorch headers, like norm_params.h).
//
// x and dy are viewed as (outer, n, inner) exactly as NormParams views x: the statistics of each
// (o, i) pair are over j = 0..n-1; element (o, j, i) of x is at x[o * x_outer_stride + j * inner + i]
// and of dy at dy[o * dy_outer_stride + j * inner + i]. dx is contiguous (outer, n, inner).
// Weight, dweight and dbias hold n contiguous elements indexed by j.
//
//   xhat = (x - mean) * rstd   (RMSNorm: mean = 0),   g = dy * weight (dy without weight)
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   (RMSNorm: without the mean_j(g) term)
//   dweight[j] = sum over (o, i) of dy * xhat,   dbias[j] = sum over (o, i) of dy
//
// Sums run in fp32 (double for float64) and are deterministic: dweight / dbias are summed per group
// of rows fixed by the shape alone, then over the groups in order, whatever the thread count.
#pragma once
#include <stdint.h>

#include "norm_params.h"  // FastnormDtype

struct NormBackwardParams {
  const void* x;
  const void* dy;
  const void* weight;  // may be null (no affine weight: g = dy)
  void* dx;            // may be null: dx not wanted
  void* dweight;       // may be null: not wanted (needs weight's dtype in wdtype)
  void* dbias;         // may be null: not wanted (always null for RMSNorm)
  // Saved statistics, one per (o, i) at index o * inner + i, float32 (float64 for float64 x). Both
  // null: recomputed exactly as the forward computes them (and at full accuracy: the forward keeps the
  // mean in two parts, a saved mean in one). RMSNorm reads rstd only.
  const void* mean;
  const void* rstd;
  int64_t outer;
  int64_t n;
  int64_t inner;
  int64_t x_outer_stride;
  int64_t dy_outer_stride;
  int dtype;   // FastnormDtype of x, dy and dx
  int wdtype;  // FastnormDtype of weight, dweight and dbias; FN_NONE when none of them is given
  int rms;     // 1: RMSNorm, 0: LayerNorm
  double eps;  // the forward's eps (used when recomputing the statistics)
  // Scratch for the dweight / dbias partial sums, fastnorm_cpu_backward_workspace_bytes(p) bytes (any
  // content). Null: the CPU kernels allocate it themselves.
  void* workspace;
  int64_t workspace_bytes;
};
