"""Single runs of kernel paths, for tools that watch a process: every CUDA kernel path once on small
inputs (sanitize, for compute-sanitizer), one call from the command line (repro), and a few cases
between cudaProfilerStart/Stop (profile, for `ncu --profile-from-start off`)."""
import argparse
import os

import torch
import torch.nn.functional as F

from fastnorm_dev import Command
from fastnorm_dev.measure import affine_params, channel_rms_ref, parse_shape, profiled_call

# profile's cases: name -> (input shape, normalized shape; None: the channel RMSNorm seed over dim 1)
PROFILE_CASES = {
    "ln_seed": ((16, 64, 256, 256), (64, 256, 256)),
    "ln_16x4194304": ((16, 4194304), (4194304,)),
    "ln_16384x4096": ((16384, 4096), (4096,)),
    "ln_4096x16384": ((4096, 16384), (16384,)),
    "ln_65536x1024": ((65536, 1024), (1024,)),
    "ln_1024x65536": ((1024, 65536), (65536,)),
    "ln_256x262144": ((256, 262144), (262144,)),
    "rms_seed": ((112, 64, 512, 512), None),  # channel axis
    "ln_1x4096": ((1, 4096), (4096,)),  # latency rows
    "ln_32x4096": ((32, 4096), (4096,)),
}


# sanitize's sections, each over every dtype; `--sections` picks some (racecheck over all of them in one
# process ended with "process didn't terminate successfully" and no hazard on the H100, session 20).
def _sanitize_rows(ext, dtype):
    import fastnorm

    # row kernel (vector, scalar), split, offset rows (chunked: 257; a warp a row: 99), thread rows
    # (several blocks, a partial last block; K = 24 at 19); the row kernel's count bounds (exactly 4: 3001x1024; at most 4:
    # 1031x3072, 3 a thread; 2: 1001x48 and 2001x64), partial last blocks
    for shape in [(5, 33), (7, 1024), (3, 4097), (2, 40000), (300, 257), (3000, 99), (3000, 7), (3000, 19), (1000, 1),
                  (3001, 1024), (1031, 3072), (1001, 48), (2001, 64)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, shape[-1:], w, w)
        fastnorm.rms_norm(x, shape[-1:], w)
    for shape in [(300, 3 * 8192 + 8), (140, 30001)]:  # cluster rows (vector and scalar), several a cluster
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, shape[-1:], w, w)
        fastnorm.rms_norm(x, shape[-1:], None)
    # Scalar cluster slices as granules: x shifted against y (its last granule at the end of the allocation),
    # 2-byte slices stored in y's grid.
    x = torch.randn(140 * 60001 + 1, device="cuda", dtype=dtype)[1:].view(140, 60001)
    w = torch.rand(60001, device="cuda", dtype=dtype)
    fastnorm.layer_norm(x, (60001,), w, w)
    fastnorm.rms_norm(x, (60001,), w)
    # Thread rows read through shared memory (unpadded, at an offset, a little padding) and from global memory
    # (rows 9 apart with K = 8), a partial last block.
    for rows, n, stride, offset in [(3001, 3, 3, 1), (1000, 7, 8, 0), (1000, 7, 9, 0), (300, 31, 32, 3)]:
        x = torch.randn(rows * stride + offset, device="cuda", dtype=dtype)[offset:].view(rows, stride)[:, :n]
        fastnorm.layer_norm(x, (n,), torch.rand(n, device="cuda", dtype=dtype), None)
        fastnorm.rms_norm(x, (n,), None)
    ext.norm_forward(torch.randn(3, 9000, device="cuda", dtype=dtype), None, None, 1, 2, 1e-5, False, 128, 7)
    # More slices than the chip holds with a cache: the split kernel without one (vector and scalar rows).
    ext.norm_forward(torch.randn(3, 50000, device="cuda", dtype=dtype), None, None, 1, 2, 1e-5, False, 32, 6000)
    ext.norm_forward(torch.randn(3, 50001, device="cuda", dtype=dtype), None, None, 1, 2, 1e-5, False, 32, 6000)
    for shape in [(2, 40001), (30, 20001)]:  # scalar rows: split slices, the cached row kernel
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, shape[-1:], w, w)
        fastnorm.rms_norm(x, shape[-1:], w)


def _sanitize_long_rows(ext, dtype):
    import fastnorm

    # Few rows of 4 MB and more: resident rows (4-8 MB in two row groups; 16 MB float32 LayerNorm stages
    # its next row in L2), streamed rows (too long to hold on chip).
    for rows, n in [(3, (8 << 20) // torch.finfo(dtype).bits * 8 + 16),
                    (3, (4 << 20) // torch.finfo(dtype).bits * 8), (2, 9 << 20), (3, 1 << 22),
                    (2, (1 << 22) + 3)]:  # (scalar rows: streamed in batches of 16 bytes)
        big = torch.randn(rows, n, device="cuda", dtype=dtype)
        wb = torch.rand(n, device="cuda", dtype=dtype)
        fastnorm.layer_norm(big, big.shape[-1:], wb, wb)
        fastnorm.rms_norm(big, big.shape[-1:], wb)
        del big, wb
    # Streamed scalar rows: in granules, one odd row (the finalize in its own launch, then merged in the output
    # blocks) and 3 rows shifted against y (output blocks of a row each); 3 longer ones element by element (output
    # blocks sweeping the rows).
    for rows, n, offset in [(1, 2784271, 0), (1, 200001, 0), (3, 100001, 1), (3, 300001, 1)]:
        x = torch.randn(rows * n + offset, device="cuda", dtype=dtype)[offset:].view(rows, n)
        wb = torch.rand(n, device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, (n,), wb, wb)
        fastnorm.rms_norm(x, (n,), wb)
        del x, wb


def _forced_shifted_rows(dtype, switch, k_switch, rms_weight, cases):
    """One row kernel forced (`switch`=1) on rows x shifted `offset` elements into their storage (the last row at
    the end of the allocation), `k_switch`=k each case: LayerNorm with weight and bias and with bias alone, RMSNorm
    (weighted or not), a training forward (saves statistics)."""
    import fastnorm

    os.environ[switch] = "1"
    for rows, n, offset, k in cases:
        os.environ[k_switch] = k
        x = torch.randn(rows * n + offset, device="cuda", dtype=dtype)[offset:].view(rows, n)
        wb = torch.rand(n, device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, (n,), wb, wb)
        fastnorm.layer_norm(x, (n,), None, wb)
        fastnorm.rms_norm(x, (n,), wb if rms_weight else None)
        torch.ops.fastnorm.layer_norm_train(x, 1, 2, wb, wb, 1e-5)
    os.environ.pop(switch, None)
    os.environ.pop(k_switch, None)


def _sanitize_offset_rows(ext, dtype):
    import fastnorm

    x = torch.randn(300, 1025, device="cuda", dtype=dtype)[:, 1:]  # misaligned rows: both offset-row kernels
    for kernel in ("chunked", "warp"):  # (chunked: chunks of y read as two of x, realigned)
        os.environ["FASTNORM_OFFSET_ROWS"] = kernel
        fastnorm.layer_norm(x, (1024,), torch.rand(1024, device="cuda", dtype=dtype), None)
        fastnorm.rms_norm(x[:, :1023], (1023,), None)
    os.environ.pop("FASTNORM_OFFSET_ROWS", None)
    # Strided rows (1025-16384, not float64), each instance: 8 elements a thread on up to 1024 threads (latency-bound
    # calls: 160 and 512 threads) and on up to 512 (FASTNORM_STRIDED_ROW_K=8, 1100 rows, 8+ an SM: 288 threads), 16
    # on up to 512 (1100 rows: 160; 320) and on 1024; x shifted (the last row at the end of the allocation),
    # parameter cases, a training forward (saves statistics).
    if dtype != torch.float64:
        _forced_shifted_rows(dtype, "FASTNORM_STRIDED_ROWS", "FASTNORM_STRIDED_ROW_K", rms_weight=False, cases=[
            (300, 1025, 1, ""), (200, 4095, 3, ""), (1100, 2049, 1, "8"), (1100, 2049, 1, ""), (150, 5001, 1, ""),
            (140, 16384, 1, ""), (700, 8193, 2, "")])
    # Granule rows (forced; 2- and 4-byte rows of 256+): 1, 2 and 4 granules a thread, x shifted (the last row's
    # last granule at the end of the allocation), odd n, parameter cases, a training forward.
    if dtype != torch.float64:
        _forced_shifted_rows(dtype, "FASTNORM_GRANULE_ROWS", "FASTNORM_GRANULE_ROW_K", rms_weight=True,
                             cases=[(300, 257, 1, "1"), (200, 4095, 3, "2"), (150, 4097, 1, "4"), (140, 1024, 1, "2")])
    # Rows of 32-48 on lane groups of the warp-row kernel (8 or 16 lanes a row), the last row at the end of
    # the allocation, the last warp's rows partial; 49 on a warp.
    for n in (32, 37, 48, 49):
        x = torch.randn(1001 * n + 1, device="cuda", dtype=dtype)[1:].view(1001, n)
        wb = torch.rand(n, device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, (n,), wb, wb)
        fastnorm.rms_norm(x, (n,), wb)
    # Contiguous rows a few elements into their buffer (every row shifted against y), the last rows at
    # the end of the allocation; rows of 8 chunks a thread (past 2048 chunks; float16: the row kernel).
    for rows, n, offset in [(200, 4744, 3), (3, 8190, 1), (5, 16382, 1), (2, 32761, 3)]:
        x = torch.randn(rows * n + offset, device="cuda", dtype=dtype)[offset:].view(rows, n)
        fastnorm.layer_norm(x, (n,), torch.rand(n, device="cuda", dtype=dtype), None)
        fastnorm.rms_norm(x, (n,), None)
    # Packed rows (whole rows in a 16-byte vector, the rows after the last whole vector one by one, at the
    # end of the allocation), one and two vectors a thread, 16-byte rows too; the training ops' forwards,
    # which save statistics, take the thread-row and row kernels instead.
    for vectors in ("1", "2"):
        os.environ["FASTNORM_PACKED_ROW_VECTORS"] = vectors
        for rows, n in [(5003, 1), (3001, 2), (2001, 4), (1001, 8)]:
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            wb = torch.rand(n, device="cuda", dtype=dtype)
            fastnorm.layer_norm(x, (n,), wb, wb)
            fastnorm.rms_norm(x, (n,), None)
            if dtype != torch.float64:
                torch.ops.fastnorm.layer_norm_train(x, 1, 2, wb, wb, 1e-5)
                torch.ops.fastnorm.rms_norm_train(x, 1, 2, wb, 1e-5)
    os.environ.pop("FASTNORM_PACKED_ROW_VECTORS", None)


def _sanitize_channels(ext, dtype):
    import fastnorm

    # Columns (up to 16 channels; also forced into tiles), tiles, registers; each access width (inner 196,
    # 98, 35); misaligned starts; few tiles narrowed to one lane (2x701x14x14); 2-byte columns (odd inner,
    # odd offsets) as granules, in several tiles an image, the last partly past inner.
    for shape, offset in [((2, 5, 3, 7), 0), ((2, 16, 14, 14), 0), ((3, 9, 7, 14), 2), ((2, 64, 8, 16), 0),
                          ((1, 300, 4, 4), 0), ((1, 3000, 4, 4), 0), ((2, 40, 7, 14), 0), ((2, 70, 5, 7), 1),
                          ((2, 701, 14, 14), 0), ((2, 113, 31, 33), 0), ((2, 72, 31, 33), 1), ((2, 616, 7, 7), 2)]:
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        x = torch.randn(numel + offset, device="cuda", dtype=dtype)[offset:].view(shape)
        for column_max in ("", "0"):
            os.environ["FASTNORM_CHANNEL_COLUMN_MAX"] = column_max
            fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
            fastnorm.layer_norm(x, None, torch.rand(shape[1], device="cuda", dtype=dtype), None, dim=1)
    os.environ.pop("FASTNORM_CHANNEL_COLUMN_MAX", None)
    # Padded rows (x[..., :W] of rows W + pad), read in place by the column kernel: 16-byte accesses, odd widths, a
    # start one element in; the last row of the last image ends at the buffer's end but for its padding.
    for shape, pad, start in [((3, 16, 8, 64), 16, 0), ((2, 5, 6, 33), 3, 0), ((2, 4, 7, 40), 8, 1)]:
        base = torch.randn(shape[:-1] + (shape[-1] + pad,), device="cuda", dtype=dtype)
        x = base[..., start:start + shape[-1]]
        fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
        fastnorm.layer_norm(x, None, torch.rand(shape[1], device="cuda", dtype=dtype), None, dim=1)


def _sanitize_family(ext, dtype):
    import fastnorm

    # The family: statistics pieces of one long run, grouped short runs, misaligned starts; both
    # output passes (long rows in vectors after a scalar head, short rows element by element).
    for shape, groups in [((2, 6, 3001), 3), ((3, 4, 5), 2), ((2, 8, 70001), 1)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[1], device="cuda", dtype=dtype)
        ext.group_norm_forward(x, w, w, groups, 1e-5)
        ext.batch_norm_forward(x, w, None, None, None, 1e-5)
        ext.group_norm_forward(torch.randn(x.numel() + 1, device="cuda", dtype=dtype)[1:].view(shape), None, None,
                               groups, 1e-5)
    # The family's backward: planes a warp each (35) and in pieces of a block (a partial tail, odd and
    # misaligned planes), SiLU, batch and given statistics, only some gradients.
    for shape, groups in [((2, 6, 5, 7), 3), ((2, 4, 3001), 2), ((1, 2, 9000), 1)]:
        for act in (0, 1):
            x = torch.randn(shape, device="cuda", dtype=dtype)
            w = torch.rand(shape[1], device="cuda", dtype=dtype)
            for mode, sets in ((0, shape[0] * groups), (1, shape[1]), (2, shape[1])):
                stats = torch.rand(2, sets, device="cuda", dtype=torch.float64 if dtype == torch.float64 else None)
                ext.family_backward(torch.randn_like(x), x, w, w, stats[0], stats[1], groups, 1e-5, act, mode,
                                    True, True, True)
                ext.family_backward(torch.randn_like(x), x, None, None, stats[0], stats[1], groups, 1e-5, act,
                                    mode, True, False, False)
    # The set path (a block a set of statistics: a (sample, group)), forward and backward.
    for shape, groups in [((16, 64, 8, 8), 16), ((8, 32, 24, 24), 32)]:
        for act in (None, "silu"):
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.rand(shape[1], device="cuda", dtype=dtype, requires_grad=True)
            fastnorm.group_norm(x, groups, w, w, activation=act).backward(torch.randn_like(x))
    for shape in [(40, 160, 4, 4), (4, 128, 24, 24)]:  # BatchNorm's: a channel a set
        x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.rand(shape[1], device="cuda", dtype=dtype, requires_grad=True)
        fastnorm.batch_norm(x, None, None, w, w, training=True).backward(torch.randn_like(x))
    # GroupNorm's chained sets (sets of 256 KB - 16 MB, fewer than 3/4 of the SMs where 1 MB or less):
    # planes that pieces span (2056), all three ticket stretches (80 sets), SiLU and float32 parameters.
    for shape, groups in [((2, 80, 2056), 1), ((40, 4, 128, 512), 2)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        for act in (0, 1):
            ext.group_norm_forward(x, torch.rand(shape[1], device="cuda"), None, groups, 1e-5, act)
    # p-norms: rows, and whole tensors, the last with 1024+ partials (merged by a block); rows for 3/4 of
    # the SMs and more (a block a row, p_norm_row_kernel: 200 rows of 4099, every row at its own offset).
    for shape, begin, end in [((5, 65535), 1, 2), ((3, 4, 5), 1, 2), ((2, 3, 4000), 0, 3), ((1025, 4097), 0, 2),
                              ((200, 4099), 1, 2)]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        ext.p_normalize(x, 1.0, begin, end, 0.0, True)
        ext.p_normalize(x, 2.0, begin, end, 1e-12, False)


def _sanitize_backward(ext, dtype):
    import fastnorm

    # Backward: fused rows (vector, scalar), long rows, the channel tile kernel (several K, scalar
    # columns) and, past its n or forced by FASTNORM_CHANNEL_BWD=0, the two channel kernels.
    # Row backward: many rows a block, so that its ring of 2-4 row buffers wraps (FASTNORM_ROW_BWD_STAGES);
    # the 2-byte rows' 16-element kernels instead of those holding g and xhat (FASTNORM_ROW_BWD_HOLD=0).
    # The channel tile kernels, staged and in registers (FASTNORM_CHANNEL_STAGED=1 / 0), the ring wrapping
    # (16x32x64x64).
    for shape, dim in [((7, 1024), 1), ((5, 33), 1), ((3, 20000), 1), ((2, 64, 33, 64), 1), ((2, 100, 16, 20), 1),
                       ((3, 7, 5, 9), 1), ((2, 200, 8, 16), 1), ((3000, 256), 1), ((1000, 40), 1),
                       ((16, 32, 64, 64), 1)]:
        for force, staged in (("", "1"), ("0", ""), ("", "0")):
            os.environ["FASTNORM_CHANNEL_BWD"] = force
            os.environ["FASTNORM_CHANNEL_STAGED"] = staged
            os.environ["FASTNORM_ROW_BWD_STAGES"] = "3" if force else ""
            os.environ["FASTNORM_ROW_BWD_HOLD"] = force
            x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.rand(shape[dim], device="cuda", dtype=dtype, requires_grad=True)
            y = fastnorm.layer_norm(x, None, w, w, dim=dim) if len(shape) > 2 else fastnorm.layer_norm(x, shape[-1:], w, w)
            y.backward(torch.randn_like(y))
            y = fastnorm.rms_norm(x, None, w, 1e-5, dim=dim) if len(shape) > 2 else fastnorm.rms_norm(x, shape[-1:], w)
            y.backward(torch.randn_like(y))
    os.environ.pop("FASTNORM_CHANNEL_BWD", None)
    os.environ.pop("FASTNORM_CHANNEL_STAGED", None)
    os.environ.pop("FASTNORM_ROW_BWD_STAGES", None)
    os.environ.pop("FASTNORM_ROW_BWD_HOLD", None)
    # Row backward blocks of 640 threads (5120 bf16), rows split over clusters of blocks (2, 3 forced
    # by FASTNORM_ROW_BWD_SPLIT, an unaligned split row), more rows than resident clusters.
    # (30000: 2-byte dbias sums in shared memory, split; 14336 the same in one block.)
    for shape, split in [((200, 5120), ""), ((300, 16384), ""), ((40, 5001), ""), ((400, 1000), "3"),
                         ((150, 14336), ""), ((70, 30000), "")]:
        os.environ["FASTNORM_ROW_BWD_SPLIT"] = split
        x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
        fastnorm.layer_norm(x, shape[-1:], w, w).backward(torch.randn(shape, device="cuda", dtype=dtype))
        fastnorm.rms_norm(x, shape[-1:], w).backward(torch.randn(shape, device="cuda", dtype=dtype))
    os.environ.pop("FASTNORM_ROW_BWD_SPLIT", None)


def _sanitize_residual(ext, dtype):
    import fastnorm

    # Residual rows (h = x + residual, y = norm(h)), forward and backward, vector and scalar rows.
    for shape in [(300, 1024), (37, 33), (20, 30000)]:
        x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        r = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype, requires_grad=True)
        y, h = fastnorm.rms_norm(x, shape[-1:], w, 1e-6, residual=r)
        torch.autograd.backward([y, h], [torch.randn_like(y), torch.randn_like(h)])
        y, h = fastnorm.layer_norm(x, shape[-1:], w, w, 1e-5, residual=r)
        torch.autograd.backward([y, h], [torch.randn_like(y), torch.randn_like(h)])


def _sanitize_loss(ext, dtype):
    import fastnorm

    # Cross-entropy rows: several rows a block (a warp a row), 2-8 warps a row, heads and tails at odd
    # offsets (x[:, 1:]), every other row, a last block with fewer rows than it holds, ignored rows.
    for rows, classes in [(37, 100), (9, 1000), (5, 32000), (3, 50257), (1, 1)]:
        base = torch.randn(rows, classes + 3, device="cuda", dtype=dtype)
        for logits in (base[:, :classes], base[:, 1:classes + 1], base[::2, 3:]):
            logits = logits.detach().requires_grad_()
            target = torch.randint(0, classes, (logits.shape[0],), device="cuda")
            target[0] = -100
            fastnorm.cross_entropy(logits, target).backward()


SANITIZE_SECTIONS = {"rows": _sanitize_rows, "long_rows": _sanitize_long_rows, "offset_rows": _sanitize_offset_rows,
                     "channels": _sanitize_channels, "family": _sanitize_family, "backward": _sanitize_backward,
                     "residual": _sanitize_residual, "loss": _sanitize_loss}


def run_sanitize(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for name in args.sections:
            SANITIZE_SECTIONS[name](ext, dtype)
    torch.cuda.synchronize()
    print(f"sanitize: all paths of {', '.join(args.sections)} ran")




def _sanitize_args(parser):
    def sections(text):
        names = [t for t in text.split(",") if t]
        unknown = [t for t in names if t not in SANITIZE_SECTIONS]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown section(s) {unknown} (choose from {', '.join(SANITIZE_SECTIONS)})")
        return names
    parser.add_argument("--sections", type=sections, default=list(SANITIZE_SECTIONS),
                        help=f"comma-separated, of {', '.join(SANITIZE_SECTIONS)} (default: all)")


def run_repro(args):
    import fastnorm

    rows, n = args.shape
    x = torch.randn(rows, n, device="cuda", dtype=args.dtype)
    w = torch.rand(n, device="cuda", dtype=args.dtype)
    if args.op == "ln":
        y = fastnorm.layer_norm(x, (n,), w, w)
    else:
        y = fastnorm.rms_norm(x, (n,), w)
    torch.cuda.synchronize()
    print("ok", y.float().abs().max().item())


def run_profile(args):
    import fastnorm

    for name, dt, op, impl in args.cases:
        dtype = torch.bfloat16 if dt == "bf16" else torch.float32
        shape, nshape = PROFILE_CASES[name]
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w, b = affine_params(nshape, dtype) if nshape else (None, None)
        if nshape is None:
            fn = (torch.compile(channel_rms_ref) if impl == "compile"
                  else lambda x: fastnorm.rms_norm(x, None, None, 1e-5, dim=1))
            call = lambda: fn(x)
        elif op == "rms":
            fn = fastnorm.rms_norm if impl != "compile" else torch.compile(F.rms_norm)
            call = lambda: fn(x, nshape, w, 1e-5)
        else:
            fn = fastnorm.layer_norm if impl != "compile" else torch.compile(F.layer_norm)
            call = lambda: fn(x, nshape, w, b, 1e-5)
        profiled_call(call, warmups=2)
        del x, w, b
    print("profile: done")


def _torch_dtype(name):
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise argparse.ArgumentTypeError(f"not a torch float dtype: {name!r} (e.g. float32, bfloat16)")
    return dtype


def _profile_case(text):
    """CASE[:dtype[:op[:impl]]] -> (case, dtype, op, impl); empty parts take the defaults."""
    name, dt, op, impl = (text.split(":") + ["", "", ""])[:4]
    if name not in PROFILE_CASES:
        raise argparse.ArgumentTypeError(f"unknown case {name!r} (choose from {', '.join(PROFILE_CASES)})")
    for value, allowed in ((dt, ("", "fp32", "bf16")), (op, ("", "ln", "rms")), (impl, ("", "fastnorm", "compile"))):
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not one of {', '.join(allowed[1:])}")
    return name, dt, op, impl


def _repro_args(p):
    p.add_argument("shape", type=parse_shape, metavar="ROWSxN")
    p.add_argument("dtype", type=_torch_dtype, metavar="DTYPE", help="a torch dtype name: float32, bfloat16, ...")
    p.add_argument("op", nargs="?", choices=("ln", "rms"), default="rms", help="default rms")


def _profile_args(p):
    p.add_argument("cases", nargs="+", type=_profile_case, metavar="CASE",
                   help=f"CASE[:dtype[:op[:impl]]] with CASE one of {', '.join(PROFILE_CASES)}; dtype fp32 "
                        "(default) or bf16; op ln (default) "
                        "or rms; impl fastnorm (default) or compile (torch.compile of the eager op, to profile "
                        "the Triton kernel it generates); rms_seed is the channel RMSNorm seed (op ignored)")


COMMANDS = (
    Command("sanitize", "every CUDA kernel path once on small inputs, for compute-sanitizer (memcheck, "
            "racecheck)", "compute-sanitizer --tool racecheck python benchmarks/devtool.py sanitize --sections channels",
            run_sanitize, _sanitize_args),
    Command("repro", "one normalization call given on the command line (for compute-sanitizer)",
            "devtool.py repro 3x4194304 bfloat16 ln", run_repro, _repro_args),
    Command("profile", "a few cases: two warm-up calls, then one between cudaProfilerStart/Stop, for "
            "ncu --profile-from-start off (torch.compile's first call compiles and may tune)",
            "ncu --profile-from-start off python benchmarks/devtool.py profile ln_seed:bf16", run_profile,
            _profile_args),
)
