"""Output and memory checks the worker runs on a candidate's outputs (torch side, child process only).

All comparisons are chunked so that 7.5 GB outputs are checked without 7.5 GB temporaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK_ELEMENTS = 1 << 25
# compare() on the CPU: a dozen temporaries a chunk, which at 2**25 elements were fresh 128 MB mappings
# each (page faults): 2.6 s to compare a 268 MB fp32 output on 2 cores, 4 s a trial in the judge; at
# 2**18 they stay in the allocator and the cache: 0.6 s (2**20: 0.8 s).
CPU_COMPARE_CHUNK_ELEMENTS = 1 << 18
SCRUB_BYTE = 0xFF  # freed memory is overwritten with all-one bytes: NaN for every float dtype, -1 for ints
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flatten_outputs(out) -> list:
    """A model's output as a flat list (Tensor, or nested tuple/list of Tensors and Python values)."""
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in flatten_outputs(item)]
    return [out]


def default_tolerance(dtype: torch.dtype) -> float:
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-4
    return 0.0  # integers and bools must match exactly


def footprint_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel must touch to read or write all of `t` (broadcast/expanded dims count once)."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return min(span, t.numel()) * t.element_size()


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """A same-shape integer view of the raw bits, so that NaN == NaN and -0.0 != 0.0."""
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_INT_OF_SIZE[t.element_size()]) if t.dtype != torch.bool else t.view(torch.uint8)


def _flat_chunks(a: torch.Tensor, chunk: int = CHUNK_ELEMENTS):
    flat = a.reshape(-1)
    for start in range(0, flat.numel(), chunk):
        yield start, flat[start:start + chunk]


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bb = _as_bits(b.to(a.device)).reshape(-1)
    return all(torch.equal(chunk, bb[s:s + chunk.numel()]) for s, chunk in _flat_chunks(_as_bits(a)))


def count_differences(a: torch.Tensor, b: torch.Tensor) -> int:
    bb = _as_bits(b).reshape(-1)
    return sum(int((chunk != bb[s:s + chunk.numel()]).sum()) for s, chunk in _flat_chunks(_as_bits(a)))


def _scrub_value(t: torch.Tensor) -> int:
    return 255 if t.dtype == torch.bool or t.element_size() == 1 else -1


def overwrite(t: torch.Tensor) -> None:
    """Fill every byte of `t` with SCRUB_BYTE (in place, through an integer view of its bits)."""
    if t.numel():
        _as_bits(t).fill_(_scrub_value(t))


def count_scrub_pattern(t: torch.Tensor) -> int:
    """Elements whose bytes are all SCRUB_BYTE - memory the candidate returned without ever writing it."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return 0
    pattern = _scrub_value(t)
    return sum(int((chunk == pattern).sum()) for _, chunk in _flat_chunks(_as_bits(t)))


def storages_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the two tensors' storages share any byte (a view, the same tensor, or a slice of it)."""
    if a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    if sa.nbytes() == 0 or sb.nbytes() == 0:
        return False
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    mismatches: int
    numel: int
    worst_index: tuple | None = None
    worst_actual: float | None = None
    worst_expected: float | None = None

    def describe(self, name: str) -> str:
        where = ""
        if self.worst_index is not None:
            where = (f"; worst at {name}[{', '.join(map(str, self.worst_index))}]: got {self.worst_actual!r}, "
                     f"expected {self.worst_expected!r}")
        return (f"{name}: {self.mismatches} of {self.numel} elements out of tolerance, max abs err "
                f"{self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}{where}")


def compare(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> Comparison:
    """allclose-style |a - e| <= atol + rtol * |e| per element, NaN only where expected is NaN, infs equal.

    Reports the element with the largest violation (or largest error when all pass).
    """
    actual = actual.to(expected.device)
    # fp16/bf16/fp32 in float32; float64 and integers (exact beyond 2**24) in float64
    narrow = (torch.float16, torch.bfloat16, torch.float32, torch.complex64)
    work = torch.float32 if expected.dtype in narrow else torch.float64
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    e_flat = expected.reshape(-1)
    worst_score, worst_flat, mismatches = -1.0, None, 0
    max_abs, max_rel = 0.0, 0.0
    chunk = CPU_COMPARE_CHUNK_ELEMENTS if expected.device.type == "cpu" else CHUNK_ELEMENTS
    for start, a in _flat_chunks(actual, chunk):
        a = a.to(work)
        e = e_flat[start:start + a.numel()].to(work)
        a_nan, e_nan = a.isnan(), e.isnan()
        diff = (a - e).abs()
        nonfinite = a_nan | e_nan | a.isinf() | e.isinf()
        # Non-finite pairs pass only when identical (NaN/NaN, +inf/+inf); otherwise they count as infinitely wrong.
        same_nonfinite = (a_nan & e_nan) | (a.isinf() & (a == e))
        diff = torch.where(nonfinite, torch.where(same_nonfinite, 0.0, float("inf")), diff)
        score = diff / (atol + rtol * torch.where(nonfinite, 0.0, e.abs()))
        score = torch.where(diff == 0, 0.0, score)  # 0/0 when atol = rtol = 0
        bad = score > 1
        mismatches += int(bad.sum())
        max_abs = max(max_abs, float(diff.max()))
        rel = diff / e.abs()
        max_rel = max(max_rel, float(torch.where(e == 0, 0.0, rel).nan_to_num(nan=0.0).max()))
        chunk_worst = int(score.argmax())
        if float(score[chunk_worst]) > worst_score:
            worst_score, worst_flat = float(score[chunk_worst]), start + chunk_worst
    if actual.numel() == 0:
        return Comparison(True, 0.0, 0.0, 0, 0)
    index = _unravel(worst_flat, tuple(expected.shape))
    return Comparison(ok=mismatches == 0, max_abs_err=max_abs, max_rel_err=max_rel, mismatches=mismatches,
                      numel=actual.numel(), worst_index=index,
                      worst_actual=_scalar(actual.reshape(-1)[worst_flat]),
                      worst_expected=_scalar(e_flat[worst_flat]))


def _unravel(flat: int, shape: tuple) -> tuple:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _scalar(t: torch.Tensor):
    value = t.item()
    return float(value) if isinstance(value, float) else value


# ---------------------------------------------------------------------------------------------------------
# Freed-memory scrubbing: the candidate must not be able to hand back the reference's freed output.

def scrub_freed_memory(device: torch.device, freed_nbytes: list[int]) -> int:
    """Overwrite memory that allocations on `device` could be served from with SCRUB_BYTE; returns bytes scrubbed.

    CUDA: every inactive block of the caching allocator on the current stream is allocated (largest first, so
    best-fit hands out exactly those blocks), filled, and released again. CPU: buffers of the freed sizes are
    allocated and filled, which is where malloc would place the next same-sized allocation.
    """
    if device.type == "cuda":
        sizes = _cached_free_block_sizes(device)
    else:
        sizes = list(freed_nbytes)
    holders = []
    for size in sorted(sizes, reverse=True):
        try:
            holders.append(torch.empty(size, dtype=torch.uint8, device=device).fill_(SCRUB_BYTE))
        except RuntimeError:  # out of memory: scrub what we can
            break
    scrubbed = sum(h.numel() for h in holders)
    del holders
    return scrubbed


def _cached_free_block_sizes(device: torch.device) -> list[int]:
    torch.cuda.synchronize(device)
    stream = torch.cuda.current_stream(device).cuda_stream
    index = device.index if device.index is not None else torch.cuda.current_device()
    sizes = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", index) != index or segment.get("stream", stream) != stream:
            continue
        sizes += [b["size"] for b in segment.get("blocks", []) if b.get("state") == "inactive"]
    return sizes
