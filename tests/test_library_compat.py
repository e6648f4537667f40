"""The torch 2.3 registration path (library_compat): without torch.library.register_autograd the ops
still have gradients, and fake implementations. Run in a subprocess with register_autograd removed, on
whatever torch CI has (register_fake stays: newer torch's impl_abstract, the 2.3 spelling, calls it)."""
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import torch
saved = torch.library.__dict__.pop("register_autograd", None)  # gone while fastnorm registers its ops
import fastnorm
if saved is not None:
    torch.library.register_autograd = saved  # torch's own modules (dynamo) use it
from torch._subclasses.fake_tensor import FakeTensorMode

kw = dict(dtype=torch.float64, requires_grad=True)
x, w, b = torch.randn(3, 5, 4, **kw), torch.randn(5, **kw), torch.randn(5, **kw)
assert torch.autograd.gradcheck(lambda x, w, b: torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5), (x, w, b))
assert torch.autograd.gradcheck(lambda x, w: torch.ops.fastnorm.rms_norm(x, 2, 3, w[:4], 1e-5), (x, w))
r = torch.randn(3, 5, 4, **kw)
assert torch.autograd.gradcheck(
    lambda x, r: torch.ops.fastnorm.add_layer_norm(x, r, 2, 3, None, None, 1e-5, False), (x, r))
with FakeTensorMode():
    fake = torch.empty(2, 8)
    assert torch.ops.fastnorm.rms_norm(fake, 1, 2, None, 1e-6).shape == (2, 8)
print("compat ok")
"""


def test_ops_have_gradients_without_register_autograd():
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "compat ok" in proc.stdout, proc.stdout + proc.stderr
