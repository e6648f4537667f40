"""Every tuning override the solver may try, on several layouts, each checked against PyTorch.

Run with CUDA_LAUNCH_BLOCKING=1 so a failing configuration is named at once.
"""
import torch

from fastnorm.ops import extension

ext = extension.load("cuda")
threads = (0, 32, 64, 128, 256, 512, 1024, 100)
blocks = (0, 1, 2, 4, 16, 300)
shapes = [((16, 64, 256, 256), 1, 4), ((8, 64, 64, 64), 1, 2), ((6, 50000), 1, 2), ((300, 1024), 1, 2)]
for shape, b0, b1 in shapes:
    x = torch.randn(shape, device="cuda") + 3
    wshape = shape[b0:b1]
    w = torch.rand(wshape, device="cuda") + 0.5
    b = torch.randn(wshape, device="cuda")
    dims = tuple(range(b0, b1))
    for t in threads:
        for g in blocks:
            for rms in (False, True):
                y = ext.norm_forward(x, w, None if rms else b, b0, b1, 1e-5, rms, t, g)
                xd = x.double()
                if rms:
                    ref = xd * torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + 1e-5)
                else:
                    m = xd.mean(dims, keepdim=True)
                    ref = (xd - m) * torch.rsqrt((xd - m).pow(2).mean(dims, keepdim=True) + 1e-5)
                wv = w.double().reshape(tuple(wshape) + (1,) * (x.dim() - b1))
                ref = ref * wv if rms else ref * wv + b.double().reshape(wv.shape)
                err = (y.double() - ref).abs().max().item()
                assert err < 1e-4, (shape, t, g, rms, err)
    print("ok", shape, flush=True)
print("config sweep: all configurations correct")
