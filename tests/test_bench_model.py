"""`fastnorm bench --suite model` on the CPU: a tiny Llama, PyTorch's norms and patched."""
import pytest

from fastnorm.bench import model_suite


def test_model_suite_runs_both_variants_in_both_modes(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setitem(model_suite.CONFIGS, "cpu", dict(model_suite.CONFIGS["cpu"], batch=1, seq=32))
    lines = []
    rows = model_suite.run("cpu", reps=1, use_compile=False, log=lines.append)
    assert [(r.mode, r.variant) for r in rows] == [("forward", "pytorch"), ("train", "pytorch"),
                                                     ("forward", "fastnorm"), ("train", "fastnorm")]
    assert all(r.ms and r.ms > 0 and r.tokens_per_s > 0 for r in rows), [r.note for r in rows]
    # 2 layers x 2 norms + the final norm; each layer's attention residual add fused into its second norm
    assert any("replaced 5 norms, fused the residual add of 2 layers" in line for line in lines)
    table = model_suite.format_rows(rows)
    assert "vs pytorch" in table and table.count("x") >= 2
    doc = model_suite.to_json("cpu", rows)
    assert doc["suite"] == "model" and len(doc["rows"]) == 4


def test_model_suite_without_transformers_says_how(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("no transformers here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    lines = []
    assert model_suite.run("cpu", log=lines.append) is None
    assert lines == ['the model suite needs transformers: pip install transformers (or "fastnorm[test]")']


def test_variants_are_timed_in_rounds_and_a_failing_one_is_reported():
    calls = []

    def make(name):
        return lambda: calls.append(name)

    def broken():
        raise RuntimeError("no kernel")

    times = model_suite._time_interleaved({"a": make("a"), "b": make("b"), "bad": broken}, "cpu", reps=3)
    assert calls == ["a"] * 3 + ["b"] * 3 + ["a", "b"] * 3  # warm-up each, then a round of every variant
    assert times["a"] >= 0 and times["b"] >= 0 and isinstance(times["bad"], RuntimeError)
