#!/usr/bin/env python3
"""Writes the case list of `fastnorm bench --suite sweep` (src/fastnorm/bench/sweep_cases.json) from a
fixed seed: a GPU list (>= 150 cases) and a CPU list (>= 60 cases, run when no GPU is present).

    python benchmarks/gen_sweep.py            # rewrite the committed list
    python benchmarks/gen_sweep.py --check    # exit 1 when the committed list differs from this script's

The list is committed so every run (and every machine) times the same cases; tests check it equals
this script's output. Change the rules here, run the script, commit both.

What the lists cover (issue 20), each case LayerNorm (weight + bias, or none) or RMSNorm (weight or
none), fp32 / bf16 / fp16:
- row lengths N from 1 to 2**24 (CPU 2**20), one per log-spaced bin, each N of a "kind" in turn: prime,
  odd, 2 mod 4, 4 mod 8, 8 mod 16, a multiple of 16, a power of two;
- row counts M from 1 to 10**6, one per log-spaced bin, with common model widths;
- named shapes from the issues (100000x257, 1x8192, 128x4096, 50257-wide rows, ...);
- x starting 1..3 elements into its buffer (16-byte alignment broken), rows otherwise contiguous;
- rows `pad` elements apart (row stride > N, non-contiguous), some also misaligned;
- the channel axis: RMSNorm / LayerNorm over dim 1 of (B, C, H, W), C from 3 to 1024, some with an
  offset or padded W.
Size rules (shrink, never skip): x's buffer (rows x row stride + offset, at its dtype) is at most
2 GB on the GPU (8 MB on the CPU): a last-dim case keeps its N and gets fewer rows; a channel case gets a
smaller batch, then a smaller H x W; a channel case's C x H x W stays under 2**25 elements (the float64
gradient reference of the backward modes runs one batch slice at a time). Other sizes are log-uniform in
total bytes from 64 KB (16 KB on the CPU) to the cap, so most cases are small and the suite is quick.
"""
import argparse
import json
import math
import random
import sys
from pathlib import Path

SEED = 20  # issue 20
OUT = Path(__file__).resolve().parents[1] / "src" / "fastnorm" / "bench" / "sweep_cases.json"
SIZES = {"fp32": 4, "bf16": 2, "fp16": 2}
DTYPES = tuple(SIZES)
OPS = ("layer_norm", "rms_norm")
KINDS = ("prime", "odd", "2mod4", "4mod8", "8mod16", "mul16", "pow2")
MAX_ROWS = 10**6
CHANNEL_ELEMENTS = 2**25  # C x H x W of a channel case at most
# Per device: cap on x's buffer in bytes, longest row, smallest total size drawn, and how many cases
# each family gets (widths, rows, misaligned, padded, channel).
LIMITS = {
    "cuda": {"cap": 2 * 10**9, "max_n": 2**24, "min_bytes": 2**16,
             "counts": {"widths": 50, "rows": 30, "misaligned": 20, "padded": 20, "channel": 32}},
    "cpu": {"cap": 8 * 10**6, "max_n": 2**20, "min_bytes": 2**14,
            "counts": {"widths": 22, "rows": 12, "misaligned": 10, "padded": 10, "channel": 12}},
}
COMMON_WIDTHS = (1, 2, 3, 64, 97, 128, 257, 768, 1000, 1024, 2048, 3000, 4096, 4097, 5120, 8192, 11008,
                 14336, 50257)
SPATIAL = ((1, 1), (3, 5), (7, 7), (13, 17), (14, 14), (28, 28), (31, 33), (32, 32), (56, 56), (64, 64),
           (112, 112), (128, 128), (224, 224), (256, 256), (512, 512))
# (op, dtype, M, N) from the issues: odd widths, latency rows, vocabulary-sized rows.
NAMED = {
    "cuda": (("layer_norm", "fp32", 100000, 257), ("rms_norm", "fp32", 100000, 257),
             ("layer_norm", "bf16", 1, 8192), ("layer_norm", "bf16", 128, 4096),
             ("rms_norm", "bf16", 4096, 50257), ("layer_norm", "fp16", 8192, 3000),
             ("rms_norm", "fp32", 1000, 1000), ("layer_norm", "bf16", 16384, 4097)),
    "cpu": (("layer_norm", "fp32", 4096, 257), ("rms_norm", "fp32", 4096, 257),
            ("layer_norm", "bf16", 1, 8192), ("rms_norm", "bf16", 32, 50257)),
}


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def of_kind(n: int, kind: str, lo: int, hi: int) -> int:
    """A number near n in [lo, hi] of the given kind (n itself when the range has none)."""
    if kind == "prime":
        up = next((m for m in range(max(n, 2), hi + 1) if is_prime(m)), None)
        down = next((m for m in range(min(n, hi), max(lo, 2) - 1, -1) if is_prime(m)), None)
        found = up if up is not None else down
    elif kind == "pow2":
        found = 2 ** round(math.log2(max(n, 1)))
    elif kind == "mul16":
        found = max(16, 16 * round(n / 16))
    else:
        step, rest = {"odd": (2, 1), "2mod4": (4, 2), "4mod8": (8, 4), "8mod16": (16, 8)}[kind]
        found = n - n % step + rest
    return found if found is not None and lo <= found <= hi else n


def log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


class Builder:
    """Collects the cases of one device type, keeping labels unique."""

    def __init__(self, device_type: str, rng: random.Random):
        self.rng, self.limits, self.cases, self.keys = rng, LIMITS[device_type], [], set()

    def add(self, op, dtype, shape, dims, affine, offset=0, pad=0) -> bool:
        key = (op, dtype, tuple(shape), tuple(dims), offset, pad)
        if key in self.keys:
            return False
        self.keys.add(key)
        self.cases.append({"op": op, "dtype": dtype, "shape": list(shape), "dims": list(dims), "affine": affine,
                           "offset": offset, "pad": pad})
        return True

    def rows_for(self, n: int, dtype: str, pad: int = 0, offset: int = 0, total=None) -> int:
        """Rows of length n: `total` bytes' worth (default: drawn log-uniform), within [1, 10**6] and
        the cap on x's buffer."""
        stride = (n + pad) * SIZES[dtype]
        if total is None:
            total = log_uniform(self.rng, self.limits["min_bytes"], self.limits["cap"])
        fit = (self.limits["cap"] - offset * SIZES[dtype]) // stride
        return max(1, min(MAX_ROWS, fit, total // stride))

    def pick(self):
        return self.rng.choice(OPS), self.rng.choice(DTYPES)

    def affine(self, op) -> bool:
        return self.rng.random() < (0.85 if op == "layer_norm" else 0.7)

    def widths(self, count):
        """One row length per log-spaced bin of [1, max_n]: the first 1, the last max_n."""
        top = math.log2(self.limits["max_n"])
        for i in range(count):
            lo = max(1, math.ceil(2 ** (top * i / count)))
            hi = max(lo, math.floor(2 ** (top * (i + 1) / count)))
            for _ in range(50):
                n = min(hi, log_uniform(self.rng, lo, hi + 0.999))
                n = of_kind(n, KINDS[i % len(KINDS)], lo, hi)
                n = 1 if i == 0 else self.limits["max_n"] if i == count - 1 else n
                op, dtype = self.pick()
                if self.add(op, dtype, (self.rows_for(n, dtype), n), (1,), self.affine(op)):
                    break

    def rows(self, count):
        """One row count per log-spaced bin of [1, 10**6]: the first 1, the last 10**6, with a common
        width that fits the cap (the widest one that does when none drawn fits)."""
        top = math.log10(MAX_ROWS)
        for i in range(count):
            lo, hi = 10 ** (top * i / count), 10 ** (top * (i + 1) / count)
            for _ in range(50):
                m = 1 if i == 0 else MAX_ROWS if i == count - 1 else log_uniform(self.rng, lo, hi)
                op, dtype = self.pick()
                fits = [w for w in COMMON_WIDTHS if m * w * SIZES[dtype] <= self.limits["cap"]]
                n = self.rng.choice(fits) if fits else 1
                if self.add(op, dtype, (m, n), (1,), self.affine(op)):
                    break

    def named(self, device_type):
        for op, dtype, m, n in NAMED[device_type]:
            self.add(op, dtype, (m, n), (1,), True)

    def strided(self, count, padded: bool):
        """Misaligned starts (offset 1..3), or padded rows (some also misaligned): N of every kind."""
        for i in range(count):
            for _ in range(50):
                n = of_kind(log_uniform(self.rng, 2, self.limits["max_n"] / 16), KINDS[i % len(KINDS)], 2,
                            self.limits["max_n"])
                pad = self.rng.choice((1, 3, 8, 16, 64, self.rng.randint(1, 127))) if padded else 0
                offset = (1 + i % 3) if not padded or i % 3 == 0 else 0
                op, dtype = self.pick()
                m = self.rows_for(n, dtype, pad, offset)
                if self.add(op, dtype, (m, n), (1,), self.affine(op), offset, pad):
                    break

    def channel(self, count):
        """dim 1 of (B, C, H, W): C log-uniform in [3, 1024] (first 3, last 1024) of every kind; every
        eighth case starts misaligned, every eighth (from the fourth) pads W."""
        for i in range(count):
            for _ in range(50):
                c = 3 if i == 0 else 1024 if i == count - 1 else of_kind(
                    log_uniform(self.rng, 3, 1024), KINDS[i % len(KINDS)], 3, 1024)
                op, dtype = self.pick()
                offset = 1 + i % 3 if i % 8 == 1 else 0
                pad = self.rng.choice((1, 5, 16)) if i % 8 == 4 else 0
                size = SIZES[dtype]
                spatial = [hw for hw in SPATIAL if c * hw[0] * (hw[1] + pad) <= CHANNEL_ELEMENTS
                           and c * hw[0] * (hw[1] + pad) * size <= self.limits["cap"]]
                h, w = self.rng.choice(spatial)
                per_image = c * h * (w + pad) * size
                total = log_uniform(self.rng, max(self.limits["min_bytes"], per_image), self.limits["cap"])
                b = max(1, min(256, total // per_image, (self.limits["cap"] - offset * size) // per_image))
                affine = self.rng.random() < (0.85 if op == "layer_norm" else 0.5)
                if self.add(op, dtype, (b, c, h, w), (1,), affine, offset, pad):
                    break


def generate() -> dict:
    """The sweep's case lists, the same on every run and every Python >= 3.9."""
    doc = {"generator": "benchmarks/gen_sweep.py", "seed": SEED}
    for i, device_type in enumerate(("cuda", "cpu")):
        build = Builder(device_type, random.Random(100 * SEED + i))
        counts = LIMITS[device_type]["counts"]
        build.widths(counts["widths"])
        build.rows(counts["rows"])
        build.named(device_type)
        build.strided(counts["misaligned"], padded=False)
        build.strided(counts["padded"], padded=True)
        build.channel(counts["channel"])
        doc[device_type] = build.cases
    return doc


def render(doc: dict) -> str:
    """JSON with one case a line, so a change to the list reads as a short diff."""
    lines = ["{", f' "generator": {json.dumps(doc["generator"])},', f' "seed": {doc["seed"]},']
    for j, device_type in enumerate(("cuda", "cpu")):
        cases = doc[device_type]
        lines.append(f' "{device_type}": [')
        lines += [f"  {json.dumps(c)}{',' if i < len(cases) - 1 else ''}" for i, c in enumerate(cases)]
        lines.append(" ]" + ("," if j == 0 else ""))
    return "\n".join(lines + ["}"]) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed list, write nothing")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = parser.parse_args(argv)
    text = render(generate())
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from benchmarks/gen_sweep.py'}")
        return 0 if same else 1
    args.out.write_text(text)
    doc = json.loads(text)
    print(f"wrote {args.out}: {len(doc['cuda'])} GPU cases, {len(doc['cpu'])} CPU cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
