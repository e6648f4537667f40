// The backward planner: which kernels take a backward call (see norm_backward_params.h).
//
//   layout      call                                                   kernels (file)
//   inner > 1   a column tile of all n channels in a block's registers     channel_backward_tile (backward_channel.cuh)
//               more channels                                          channel_backward_coeffs / _apply (same file)
//   inner == 1  rows a block holds (<= 1024 threads x 8 elements (16:  row_backward (backward_rows.cuh)
//               2-byte rows without dbias), x and dy of its rows in <=
//               200 KB of shared memory), or a
//               cluster of up to 8 blocks (Hopper)
//               longer rows                                            long_backward_* (backward_long_rows.cuh)
// then, for dweight / dbias, reduce_partials (backward_common.cuh) over the partials the kernels wrote.
//
// Workspace: the path's own scratch, then the dweight partials, then the dbias partials, each
// [parts][n] in the accumulator type.
#pragma once
#include "backward_channel.cuh"
#include "backward_long_rows.cuh"
#include "backward_rows.cuh"

namespace fastnorm {

static inline int64_t align_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch layout of a call whose path needs `own` bytes and writes `parts` partials of n values.
template <typename A>
struct BackwardScratch {
  int64_t own, parts, bytes;
  void *dw_part, *db_part;

  BackwardScratch(const NormBackwardParams& p, int64_t own_bytes, int64_t part_count)
      : own(align_up(own_bytes)), parts(part_count) {
    const int64_t part_bytes = align_up(parts * p.n * int64_t(sizeof(A)));
    unsigned char* base = static_cast<unsigned char*>(p.workspace);
    dw_part = p.dweight && base ? base + own : nullptr;
    db_part = p.dbias && base ? base + own + (p.dweight ? part_bytes : 0) : nullptr;
    bytes = own + part_bytes * ((p.dweight ? 1 : 0) + (p.dbias ? 1 : 0));
  }
};

// With `workspace_bytes` set, only says how much scratch the call needs; else checks the scratch,
// runs the path (`launch`, which writes the partials) and reduces the partials into dweight / dbias.
template <typename A, typename W, typename Launch>
static inline const char* run_backward(const NormBackwardParams& p, const BackwardScratch<A>& s, cudaStream_t stream,
                                       int64_t* workspace_bytes, Launch launch) {
  if (workspace_bytes) {
    *workspace_bytes = s.bytes;
    return nullptr;
  }
  if (p.workspace_bytes < s.bytes || (s.bytes > 0 && p.workspace == nullptr)) return "backward workspace missing or too small";
  if (const char* err = launch()) return err;
  launch_reduce_partials<A, W>(s.dw_part, p.dweight, s.db_part, p.dbias, s.parts, p.n, stream);
  return launch_result(cudaGetLastError());
}

template <typename T, typename W, int VEC>
static inline const char* backward_rows(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes) {
  using A = typename AccOf<T>::type;
  const RowBackwardPlan plan = plan_row_backward<T, W, VEC>(p);
  const bool fused = plan.tpr > 0;
  const BackwardScratch<A> s(p, fused ? 0 : long_backward_workspace(p, VEC),
                             fused ? plan.parts : long_backward_parts(p, VEC));
  return run_backward<A, W>(p, s, stream, workspace_bytes, [&] {
    return fused ? launch_row_backward<T, W, VEC>(p, plan, s.dw_part, s.db_part, stream)
                 : launch_long_backward<T, W, VEC>(p, s.parts, s.dw_part, s.db_part, stream);
  });
}

template <typename T, typename W, int VEC>
static inline const char* backward_channel(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes) {
  using A = typename AccOf<T>::type;
  constexpr int kTileVec = kChannelTileVec<VEC>;
  const ChannelTilePlan plan = plan_channel_tile<T, W, kTileVec>(p);
  const bool fused = plan.k > 0;
  const BackwardScratch<A> s(p, fused ? 0 : channel_backward_workspace(p), fused ? plan.grid : p.outer);
  return run_backward<A, W>(p, s, stream, workspace_bytes, [&] {
    return fused ? launch_channel_tile<T, W, kTileVec>(p, plan, s.dw_part, s.db_part, stream)
                 : launch_channel_backward<T, W, VEC>(p, s.dw_part, s.db_part, stream);
  });
}

template <typename T, typename W>
static inline const char* backward_layout(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes) {
  constexpr int kVec = 16 / sizeof(T);
  const bool aligned = aligned16(p.x) && aligned16(p.dy) && aligned16(p.dx) && aligned16(p.dx_add) && p.x_outer_stride % kVec == 0;
  if (p.inner > 1) {
    return aligned && p.inner % kVec == 0 ? backward_channel<T, W, kVec>(p, stream, workspace_bytes)
                                          : backward_channel<T, W, 1>(p, stream, workspace_bytes);
  }
  const bool vec = aligned && aligned16(p.weight) && p.n % kVec == 0;
  return vec ? backward_rows<T, W, kVec>(p, stream, workspace_bytes) : backward_rows<T, W, 1>(p, stream, workspace_bytes);
}

}  // namespace fastnorm

// One translation unit per (input, parameter) dtype pair defines its entry with this (backward_*.cu).
#define FASTNORM_BACKWARD_INSTANCE(name, T, W)                                                      \
  const char* fastnorm::name(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes) { \
    return backward_layout<T, W>(p, stream, workspace_bytes);                                       \
  }
