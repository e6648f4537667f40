"""Which kernel family takes a norm_forward call: the rules of kernels/planner.cuh, mirrored in Python.

The solver builds only the families its traced calls land on, so it must know them before it builds.
The C++ planner stays the authority: where its choice depends on what only the driver knows
(occupancy, cluster capacity), this mirror assumes the planner's usual outcome on the device (the
kernel fits). If it is wrong, the built planner skips the missing family and the next one in its
order takes the call, or the call answers "not in this build" and the solver rebuilds with every
family (solver.py). Keep the constants and rules in step with the .cuh files named below.
"""
import math
from dataclasses import dataclass

from fastnorm.solve.extension_calls import ExtensionCall

ROW_CACHE_BYTES = 96 << 10     # cuda_rows.cuh kRowCacheBytes
SLICE_BYTES = 64 << 10         # cuda_rows.cuh kSliceBytes
MAX_ROW_THREADS = 512          # cuda_rows.cuh kMaxRowThreads
STREAM_ROW_BYTES = 4 << 20     # resident_kernel.cuh kStreamRowBytes
STREAM_L2_BYTES = 8 << 20      # planner.cuh kStreamL2Bytes
STREAM_LEAST_BYTES = 64 << 10  # planner.cuh kStreamLeastBytes
STREAM_THREADS = 256           # streamed_kernels.cuh kStreamThreads
STREAM_VECS = 4                # streamed_kernels.cuh kStreamVecs
RESIDENT_ROW_BYTES = 8 << 20   # resident_kernel.cuh kResidentRowBytes
HELD_ROW_LEAST_BYTES = 3 << 20  # held_rows_kernel.cuh kHeldRowLeastBytes
HELD_ROW_MOST_BYTES = 8 << 20   # held_rows_kernel.cuh kHeldRowMostBytes
HELD_ROW_CHUNK = 256 * (8 + 12)  # held_rows_kernel.cuh kHeldRowChunk (vectors)
HELD_ROW_SMEM = 12 * 256 * 16   # held_rows_kernel.cuh held_rows_smem
GROUPED_ROWS = 2               # resident_kernel.cuh kGroupedRows
RESIDENT_THREADS = 1024        # resident_kernel.cuh kResidentThreads
SPLIT_ROWS = 32                # planner.cuh kSplitRows
SHORT_ROW_VECTORS = 16         # planner.cuh kShortRowVectors
ROW_FILL_BLOCKS = 2            # cuda_rows.cuh kRowFillBlocks
CLUSTER_SLICE_BYTES = 64 << 10  # cluster_kernel.cuh kClusterSliceBytes
MAX_CLUSTER = 8                # cluster_kernel.cuh kMaxCluster
FEW_ROWS_THREADS = 1024        # few_rows_kernel.cuh kFewRowsThreads
FEW_ROWS_WAVE_THREADS = 2048   # few_rows_kernel.cuh kFewRowsWaveThreads
FEW_ROWS_WAVE_VECTORS = 64     # few_rows_kernel.cuh kFewRowsWaveVectors
OFFSET_ROW_MAX_THREADS = 512   # offset_rows_kernel.cuh kOffsetRowMaxThreads
OFFSET_ROW_MAX_K = 4           # offset_rows_kernel.cuh kOffsetRowMaxK
OFFSET_ROW_WIDE_K = 8          # offset_rows_kernel.cuh kOffsetRowWideK (bfloat16 only: kOffsetRowTopK)
STRIDED_ROW_MIN_N = 1025       # strided_rows_kernel.cuh kStridedRowMinN
STRIDED_ROW_MAX_THREADS = 1024  # strided_rows_kernel.cuh kStridedRowMaxThreads
STRIDED_ROW_MAX_K = 16         # strided_rows_kernel.cuh kStridedRowMaxK
STRIDED_SMALL_ROWS = 8         # strided_rows_kernel.cuh kStridedSmallRows
THREAD_ROWS_MAX_F64 = 16       # offset_rows_kernel.cuh kThreadRowMaxN: float64 rows of 17-31 take the row kernel
MAX_SMEM = 200 << 10           # cuda_launch.cuh kMaxSmem


def offset_rows_cover(n: int, dtype: str, param_dtype: str | None = None) -> bool:
    """offset_rows_kernel.cuh offset_rows_take for contiguous rows (32 and more; thread_rows_take, the same
    family, has 1-31, strided_rows_plan some of 1025-16384 and granule_rows_plan some of 1025-12288, all inside
    this cover): the 16-byte chunks a row of n can touch fit 512 threads of 4 chunks each (n up to 8189
    float32, 16377 2-byte types, 4095 float64), or of 8 (bfloat16 only) where the weight and bias of those
    chunks fit shared memory."""
    elem = elem_size(dtype)
    vec = 16 // elem
    chunks = (n + 2 * vec - 2) // vec
    if chunks <= OFFSET_ROW_MAX_THREADS * OFFSET_ROW_MAX_K:
        return True
    w_elem = elem_size(param_dtype) if param_dtype else elem
    return dtype == "bfloat16" and chunks <= OFFSET_ROW_MAX_THREADS * OFFSET_ROW_WIDE_K and \
        chunks * 2 * vec * w_elem <= MAX_SMEM


@dataclass(frozen=True)
class CudaDevice:
    """What the planner reads of the device (cuda_launch.cuh Device). The default is an H100 SXM."""
    sms: int = 132
    major: int = 9
    coop: bool = True
    smem_per_sm: int = 228 << 10

    @classmethod
    def of(cls, device) -> "CudaDevice":
        import torch

        props = torch.cuda.get_device_properties(device)
        return cls(props.multi_processor_count, props.major, True,
                   getattr(props, "shared_memory_per_multiprocessor", cls.smem_per_sm))


def elem_size(dtype: str) -> int:
    return {"float64": 8, "float32": 4}.get(dtype, 2)


def _pow2_at_least(v: int) -> int:
    p = 1
    while p < v and p < (1 << 30):
        p <<= 1
    return p


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def row_vec(call: ExtensionCall) -> int:
    """planner.cuh row_vec, for contiguous inputs (fresh allocations are 16-byte aligned)."""
    vec = 16 // elem_size(call.dtype)
    return vec if call.n % vec == 0 else 1


def threads_hint(threads: int, lo: int) -> int:
    if threads <= 0:
        return 0
    t = lo
    while t * 2 <= threads and t * 2 <= MAX_ROW_THREADS:
        t *= 2
    return t


def wanted_blocks_per_row(call: ExtensionCall, dev: CudaDevice, blocks_per_row: int) -> int:
    if blocks_per_row > 0:
        return blocks_per_row
    row_bytes = call.n * elem_size(call.dtype)
    few_rows = call.outer < dev.sms
    if row_bytes <= ROW_CACHE_BYTES and not (few_rows and row_bytes >= (64 << 10)):
        return 1
    g = _ceil(row_bytes, SLICE_BYTES)
    if few_rows:
        g = max(g, min(dev.sms * 2 // call.outer, row_bytes // (16 << 10)))
    return g


def _held_rows_take(call: ExtensionCall, dev: CudaDevice, vec: int, threads: int, blocks_per_row: int) -> bool:
    """held_rows_kernel.cuh held_rows_chunks: LayerNorm rows of 3-8 MB in 16-byte vectors (not float64), a row's chunks
    at most half the blocks the device holds, a wave of blocks in all."""
    elem = elem_size(call.dtype)
    if vec == 1 or elem == 8 or threads > 0 or blocks_per_row > 0 or call.rms or \
            not HELD_ROW_LEAST_BYTES <= call.n * elem < HELD_ROW_MOST_BYTES:
        return False
    chunks = _ceil(call.n // vec, HELD_ROW_CHUNK)
    slots = min(dev.smem_per_sm // (HELD_ROW_SMEM + (2 << 10)), 4) * dev.sms
    return 0 < slots and 2 * chunks <= slots and call.outer * chunks >= slots


def _resident_takes(call: ExtensionCall, dev: CudaDevice, vec: int, blocks_per_row: int) -> bool:
    """resident_kernel.cuh resident_groups and resident_plan (the kernel assumed to fit)."""
    if not dev.coop or dev.sms > RESIDENT_THREADS or vec == 1 or blocks_per_row > 0:
        return False
    elem = elem_size(call.dtype)
    row_bytes, max_k = call.n * elem, 8 if elem == 4 else 4
    per_sm = RESIDENT_THREADS * max_k * vec
    if row_bytes >= STREAM_ROW_BYTES and call.outer >= GROUPED_ROWS and call.n <= (dev.sms // 2) * per_sm:
        groups = 2
    elif row_bytes >= RESIDENT_ROW_BYTES and call.n <= dev.sms * per_sm:
        groups = 1
    else:
        return False
    k = _pow2_at_least(_ceil(call.n // vec, (dev.sms // groups) * RESIDENT_THREADS))
    return k == 4 or (k == 8 and max_k >= 8) or (groups == 1 and k in (1, 2))


def _streamed_takes(call: ExtensionCall, dev: CudaDevice, vec: int, blocks_per_row: int) -> bool:
    """planner.cuh streamed_rows: rows of 4 MB+, or calls of at most STREAM_L2_BYTES whose apply launch
    (a block a row's column chunk, or a column chunk of every row) gives half the SMs a block."""
    if blocks_per_row > 0 or call.outer >= dev.sms:
        return False
    row_bytes = call.n * elem_size(call.dtype)
    if row_bytes >= STREAM_ROW_BYTES:
        return not (call.outer >= SPLIT_ROWS and row_bytes < RESIDENT_ROW_BYTES)
    columns = _ceil(call.n // vec, STREAM_THREADS * STREAM_VECS)
    blocks = call.outer * columns if call.outer > 1 and columns < dev.sms else columns
    return (row_bytes >= STREAM_LEAST_BYTES and call.outer < SPLIT_ROWS and call.outer * row_bytes <= STREAM_L2_BYTES
            and blocks >= dev.sms // 2)


def _cluster_blocks(call: ExtensionCall, dev: CudaDevice, threads: int, blocks_per_row: int) -> int:
    if dev.major < 9 or blocks_per_row > 0 or threads > 0:
        return 0
    row_bytes = call.n * elem_size(call.dtype)
    if row_bytes <= ROW_CACHE_BYTES:
        return 0
    g = 2
    while g < MAX_CLUSTER and row_bytes > g * CLUSTER_SLICE_BYTES:
        g *= 2
    if _ceil(row_bytes, g) > CLUSTER_SLICE_BYTES or call.outer * g < dev.sms:
        return 0
    return g


def _slices_cached(call: ExtensionCall, dev: CudaDevice, threads: int, g: int) -> bool:
    """plan_rows: the split kernel caches its slices when the g blocks of a row can all be resident with
    their slice in shared memory (per SM: at most 2048 threads, 32 blocks, its shared memory)."""
    vec = row_vec(call)
    smem = _ceil(call.n // vec, g) * vec * elem_size(call.dtype)
    if smem > MAX_SMEM:
        return False
    per_sm = min(2048 // (threads_hint(threads, 32) or MAX_ROW_THREADS), 32, dev.smem_per_sm // (smem + 1024))
    return per_sm * dev.sms >= g


def _few_rows_take(call: ExtensionCall, dev: CudaDevice, vec: int, threads: int) -> bool:
    """few_rows_kernel.cuh few_rows_take for a forward that saves no training statistics."""
    if threads > 0 or call.n // vec > FEW_ROWS_THREADS:
        return False
    if call.outer < dev.sms:
        return True
    return (vec > 1 and call.n // vec >= FEW_ROWS_WAVE_VECTORS
            and call.outer * max(32, _pow2_at_least(call.n // vec)) <= dev.sms * FEW_ROWS_WAVE_THREADS)


def _strided_rows_take(call: ExtensionCall, dev: CudaDevice, vec: int, threads: int, blocks_per_row: int) -> bool:
    """strided_rows_kernel.cuh strided_rows_plan (the offset-row family): scalar rows of 1025-16384, not float64,
    in a latency-bound call (strided_small_call) or float16 in a call of STRIDED_SMALL_ROWS rows an SM and more
    (and float32 rows of x views at other offsets than y's, strided_takes_f32_rows: never a contiguous input,
    and inside offset_rows_cover)."""
    longest = STRIDED_ROW_MAX_THREADS * STRIDED_ROW_MAX_K
    if vec != 1 or not STRIDED_ROW_MIN_N <= call.n <= longest or elem_size(call.dtype) == 8 or threads > 0 \
            or blocks_per_row > 0:
        return False
    many = call.outer >= STRIDED_SMALL_ROWS * dev.sms
    small = not many and (call.n <= 4096 or (call.outer < dev.sms and call.n <= 8192))
    return small or (call.dtype == "float16" and many)


def norm_family(call: ExtensionCall, device_type: str, dev: CudaDevice = CudaDevice(), threads: int = 0,
                blocks_per_row: int = 0) -> str:
    """The family (kernels/selection.py FAMILIES) that takes a norm_forward call with these overrides."""
    if call.inner != 1:
        return "channel"
    if device_type == "cpu":
        return "row"
    vec = row_vec(call)
    if _held_rows_take(call, dev, vec, threads, blocks_per_row):
        return "held_rows"
    if _resident_takes(call, dev, vec, blocks_per_row):
        return "resident"
    if _streamed_takes(call, dev, vec, blocks_per_row):
        return "streamed"
    if _cluster_blocks(call, dev, threads, blocks_per_row) > 0:
        return "cluster"
    if _few_rows_take(call, dev, vec, threads):
        return "few_rows"
    row_bytes = call.n * elem_size(call.dtype)
    if 0 < row_bytes <= 16 and 16 % row_bytes == 0 and threads <= 0 and blocks_per_row <= 0:
        return "offset_rows"  # packed_rows_kernel.cuh packed_rows_take: whole rows in a vector
    if _strided_rows_take(call, dev, vec, threads, blocks_per_row):
        return "offset_rows"
    f64_gap = elem_size(call.dtype) == 8 and THREAD_ROWS_MAX_F64 < call.n < 32
    if (vec == 1 and offset_rows_cover(call.n, call.dtype, call.param_dtype) and not f64_gap and threads <= 0
            and blocks_per_row <= 0):
        return "offset_rows"
    g = wanted_blocks_per_row(call, dev, blocks_per_row)
    if g > 1 and dev.coop:
        return "split" if _slices_cached(call, dev, threads, g) else "split_uncached"
    return "row"


def launch_key(call: ExtensionCall, device_type: str, dev: CudaDevice = CudaDevice(), threads: int = 0,
               blocks_per_row: int = 0) -> tuple:
    """What a launch of the call depends on: overrides giving the same key launch the same kernels."""
    family = norm_family(call, device_type, dev, threads, blocks_per_row)
    if device_type == "cpu":
        return (family,)  # the CPU kernels ignore both overrides
    if family == "row":
        if threads > 0:
            return family, min(threads_hint(threads, 1), MAX_ROW_THREADS)
        nvec = call.n // row_vec(call)
        per_thread = 1 if call.outer < dev.sms else 2 if nvec <= SHORT_ROW_VECTORS else 4
        while True:  # fewer vectors a thread until the SMs get ROW_FILL_BLOCKS blocks each (or one a thread)
            tpr = min(_pow2_at_least(_ceil(nvec, per_thread)), MAX_ROW_THREADS)
            rows_per_block = max(tpr, 256) // tpr
            if per_thread == 1 or _ceil(call.outer, rows_per_block) >= ROW_FILL_BLOCKS * dev.sms:
                return family, tpr
            per_thread //= 2
    if family in ("split", "split_uncached"):
        return family, threads_hint(threads, 32) or MAX_ROW_THREADS, wanted_blocks_per_row(call, dev, blocks_per_row)
    return (family,)


SET_MAX_BYTES = 1 << 20          # family_set_kernels.cuh set_max_bytes
SET_WARPS = 32                   # family_set_kernels.cuh kWarps
CHAIN_MIN_BYTES = 256 << 10      # family_chain_kernel.cuh chain_plan
CHAIN_MAX_BYTES = 16 << 20
HELD_MIN_BYTES = 2 << 20         # held_chain_kernel: sets of 2 MB up, chunks of 20 vectors of 16 bytes a thread,
HELD_CHUNK_BYTES = 256 * 20 * 16  # a set's chunks at most half the blocks held at once (4 an SM)
HELD_BLOCKS_PER_SM = 4
LONG_ROW = 2048                  # family_kernels.cuh kLongRow


def _family_dims(call: ExtensionCall) -> tuple:
    n, channels = call.shape[0], call.shape[1] if len(call.shape) > 1 else 1
    return n, channels, math.prod(call.shape[2:])


def _set_path_takes(call: ExtensionCall, dev: CudaDevice, batch: bool) -> bool:
    """family_set_kernels.cuh set_forward_plan / set_path_ok: a block a set (x contiguous and aligned)."""
    size = elem_size(call.dtype)
    n, channels, spatial = _family_dims(call)
    groups = channels if batch else call.groups
    if groups <= 0 or spatial == 0:
        return False
    runs, sets, vec = (n, channels, 16 // size) if batch else (channels // groups, n * groups, 16 // size)
    if spatial % vec or 4 * sets < 3 * dev.sms or runs * spatial * size > SET_MAX_BYTES:
        return False
    vecs, want = spatial // vec, _ceil(SET_WARPS, max(runs, 1))
    segs = want if want < vecs else max(vecs, 1)
    return 2 * runs * segs * 8 <= 32 * 1024


def group_chain_takes(call: ExtensionCall, dev: CudaDevice) -> str:
    """family_chain_kernel.cuh chain_plan, for a contiguous input and the tuning variables unset: "group_held"
    (the held chain), "group_chain" (the lag chain) or "" (neither)."""
    if call.function != "group_norm_forward" or len(call.shape) < 3 or call.groups <= 0:
        return ""
    size = elem_size(call.dtype)
    _, channels, spatial = _family_dims(call)
    set_bytes = channels // call.groups * spatial * size
    if spatial < LONG_ROW or spatial % (16 // size) or not CHAIN_MIN_BYTES <= set_bytes <= CHAIN_MAX_BYTES:
        return ""
    if _set_path_takes(call, dev, batch=False):
        return ""
    chunks = _ceil(set_bytes, HELD_CHUNK_BYTES)
    held = size < 8 and set_bytes >= HELD_MIN_BYTES and 2 * chunks <= HELD_BLOCKS_PER_SM * dev.sms
    return "group_held" if held else "group_chain"


def family_paths(call: ExtensionCall, device_type: str, dev: CudaDevice = CudaDevice()) -> frozenset:
    """The family.cu forward paths a group_norm_forward / batch_norm_forward / p_normalize call may take on
    CUDA: "group_held", "group_chain", "family_sets" (a block a set), "family_passes" (the multi-kernel path).
    BatchNorm and the p-norms keep the multi-kernel path always: BatchNorm's eval calls (running statistics) take
    it and record the same as its training calls, and p_normalize's rows kernel has an entry of its own."""
    if device_type != "cuda" or call.function not in ("group_norm_forward", "batch_norm_forward", "p_normalize"):
        return frozenset()
    if call.function == "p_normalize":
        return frozenset({"family_passes"})
    if call.function == "batch_norm_forward":
        return frozenset({"family_passes"} | ({"family_sets"} if _set_path_takes(call, dev, batch=True) else set()))
    chain = group_chain_takes(call, dev)
    if chain:
        return frozenset({chain})
    return frozenset({"family_sets" if _set_path_takes(call, dev, batch=False) else "family_passes"})

