"""Loading the compiled kernels: a process whose build is cached imports it directly, without
torch.utils.cpp_extension (and the setuptools it pulls in, 0.15 s of the first call)."""
import subprocess
import sys

from fastnorm.build_env import BUILDS_ENV
from fastnorm.ops import extension

CHILD = """
import sys, time, torch, fastnorm
x = torch.randn(8, 64)
start = time.perf_counter()
y = fastnorm.layer_norm(x, (64,), torch.ones(64), torch.zeros(64))
assert torch.allclose(y, torch.nn.functional.layer_norm(x, (64,)), atol=1e-5)
print("cpp_extension imported:", "torch.utils.cpp_extension" in sys.modules)
"""


def test_a_cached_build_loads_without_cpp_extension():
    extension.load("cpu")  # builds here when nothing is cached yet
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cpp_extension imported: False" in done.stdout, done.stdout + done.stderr


def test_the_guessed_root_is_cpp_extensions_own(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv(BUILDS_ENV, raising=False)
    # Keep torch from creating folders in the user's cache: point the cache home at tmp_path.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert extension._guessed_build_root() == extension._build_root()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert extension._guessed_build_root() == extension._build_root() == tmp_path / "ext"


def test_fastnorm_extensions_dir_comes_before_torchs(monkeypatch, tmp_path):
    """fastnorm eval gives each judge the candidate's TORCH_EXTENSIONS_DIR and one FASTNORM_EXTENSIONS_DIR
    for fastnorm's own build: fastnorm builds and looks in the latter."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "candidate"))
    monkeypatch.setenv(BUILDS_ENV, str(tmp_path / "fastnorm"))
    assert extension._guessed_build_root() == extension._build_root() == tmp_path / "fastnorm"
