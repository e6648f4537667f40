"""What `import fastnorm` and its first call cost a fresh process, against the same torch call.

    python3 benchmarks/import_time.py [--device cuda|cpu] [--runs 5]

Each run is a new interpreter that imports torch, makes a tensor, and times (a) torch's layer_norm, or
(b) `import fastnorm` plus fastnorm.layer_norm, its build already cached (a first, untimed process builds
it). Printed: the medians of each phase and the extra time of (b) over (a); then the ten slowest
fastnorm modules of `python3 -X importtime -c "import fastnorm"`.
"""
import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
device = sys.argv[1]
x = torch.randn(64, 1024, device=device)
w, b = torch.ones(1024, device=device), torch.zeros(1024, device=device)
if device == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
if sys.argv[2] == "fastnorm":
    import fastnorm
    t3 = time.perf_counter()
    y = fastnorm.layer_norm(x, (1024,), w, b)
else:
    t3 = time.perf_counter()
    y = torch.nn.functional.layer_norm(x, (1024,), w, b)
if device == "cuda":
    torch.cuda.synchronize()
t4 = time.perf_counter()
print(t1 - t0, t3 - t2, t4 - t3)
"""


def phases(device: str, which: str):
    out = subprocess.run([sys.executable, "-c", CHILD, device, which], capture_output=True, text=True, check=True)
    return [float(v) for v in out.stdout.split()[-3:]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.device is None:  # asked of a child: this process stays free of torch, as the timed ones start
        probe = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
        args.device = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                     check=True).stdout.strip()
    phases(args.device, "fastnorm")  # builds or loads the cached build once, untimed
    medians = {}
    for which in ("torch", "fastnorm"):
        runs = [phases(args.device, which) for _ in range(args.runs)]
        medians[which] = [statistics.median(r[i] for r in runs) for i in range(3)]
        torch_s, import_s, call_s = medians[which]
        print(f"{which:<9} import torch {torch_s:.3f} s, import {'fastnorm' if which == 'fastnorm' else '-':<8} "
              f"{import_s:.3f} s, first call {call_s:.3f} s   (medians of {args.runs} processes)")
    extra = sum(medians["fastnorm"][1:]) - sum(medians["torch"][1:])
    print(f"fastnorm's import + first call beyond torch's first call: {extra:.3f} s (target <= 0.2 s)")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fastnorm"], capture_output=True, text=True)
    rows = []
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and "fastnorm" in parts[2]:
            rows.append((int(parts[1]), parts[2].rstrip()))
    print("slowest fastnorm modules (cumulative us, -X importtime):")
    for us, name in sorted(rows, reverse=True)[:10]:
        print(f"  {us:9d} {name}")


if __name__ == "__main__":
    main()
