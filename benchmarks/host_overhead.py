"""Host time per call (us) of fastnorm vs PyTorch on a tiny tensor: what decides small shapes."""
import time

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import extension

dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(4, 64, device=dev)
w = torch.rand(64, device=dev)
b = torch.randn(64, device=dev)
ext = extension.load(dev)
calls = {
    "F.layer_norm": lambda: F.layer_norm(x, (64,), w, b),
    "fastnorm.layer_norm": lambda: fastnorm.layer_norm(x, (64,), w, b),
    "torch.ops.fastnorm.layer_norm": lambda: torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5),
    "ext.norm_forward": lambda: ext.norm_forward(x, w, b, 1, 2, 1e-5, False, 0, 0),
}
for name, fn in calls.items():
    for _ in range(200):
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(2000):
        fn()
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"{name:<32}{(time.perf_counter() - t) / 2000 * 1e6:8.1f} us/call", flush=True)
