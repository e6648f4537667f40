"""The worker's "baseline" mode (the reference validated and timed, with torch.compile if asked, the copy
bandwidth and the minimal bytes) and its "import" mode (a candidate's pre-build). See worker.py."""
from __future__ import annotations

import torch

from fastnorm.harness import checks
from fastnorm.harness.loading import (REFERENCE_MODULE, Progress, build_model, device_name, import_candidate,
                                      load_module, make_inputs, resolve_device, to_device)
from fastnorm.harness.messages import clip, describe_exception, exception_message
from fastnorm.harness.timing import (DEFAULT_TIMING, TrialHooks, copy_bandwidth, effective_timing, include_host_for,
                                     time_callable)


def run_import(cfg: dict, progress: Progress) -> dict:
    progress("import candidate")
    import_candidate(cfg)
    return {"verdict": "ok", "message": ""}


def run_baseline(cfg: dict, progress: Progress) -> dict:
    device = resolve_device(cfg["device"])
    result = {"ok": False, "device": str(device), "device_name": device_name(device),
              "torch_version": torch.__version__}
    seed = cfg["seed"]
    # The reference (and its torch.compile) in the candidates' timing mode: the speedup is a ratio of the two.
    include_host = include_host_for(cfg.get("timing", DEFAULT_TIMING))
    result["timing_mode"] = effective_timing(device, include_host)
    progress("import reference")
    try:
        ref_mod = load_module(cfg["reference"], REFERENCE_MODULE)
        progress("construct reference")
        model = build_model(ref_mod.Model, to_device(ref_mod.get_init_inputs(), device), seed, device)
        progress("reference forward")
        inputs = make_inputs(ref_mod, seed + 1, device)
        with torch.no_grad():
            outputs = checks.flatten_outputs(model(*inputs))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except BaseException as exc:
        result["message"] = exception_message(exc, cfg["reference"], prefix="the reference failed: ")
        return result
    tensors_in = [t for t in inputs if isinstance(t, torch.Tensor)]
    tensors_out = [t for t in outputs if isinstance(t, torch.Tensor)]
    min_bytes = sum(map(checks.footprint_bytes, tensors_in)) + sum(map(checks.footprint_bytes, tensors_out))
    result["outputs"] = [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in tensors_out]
    result["min_bytes"] = min_bytes
    del outputs, tensors_out

    progress("copy bandwidth")
    # Two copies: a large one (the asymptotic bandwidth) and one moving the problem's own bytes under the same
    # cache flush, which profits from the same effects (outputs still in a write-back cache when the clock
    # stops) that an honest kernel of this size does. The floor uses the fastest copy of either: conservative.
    limit = torch.cuda.mem_get_info(device)[0] // 3 if device.type == "cuda" else 1 << 30
    large = min(1 << 30 if device.type == "cuda" else 256 << 20, limit)
    same_size = min(max(min_bytes // 2, 1 << 20), limit)
    # The large copy depends on the GPU only: the parent passes it in once one baseline on this GPU measured it.
    # Timed in the same mode as the models (device timing: without the copy's launch latency).
    result["copy_bw_large"] = cfg.get("copy_bw_large") or copy_bandwidth(device, large, best=True,
                                                                          include_host=include_host)
    result["copy_bw_same_size"] = copy_bandwidth(device, same_size, best=True, include_host=include_host)
    result["copy_bw"] = max(result["copy_bw_large"], result["copy_bw_same_size"])

    progress("time reference")

    def eager():
        with torch.no_grad():
            return model(*inputs)

    # Timed like a candidate (whose loop announces each call to the judge): each output lives to its trial's end.
    result["ref_timing"] = {**time_callable(eager, device=device, trials=cfg["perf_trials"], warmup=cfg["warmup"],
                                           include_host=include_host, hooks=TrialHooks()).to_dict(),
                            "mode": result["timing_mode"]}
    result["compiled_timing"] = result["compile_error"] = None
    if cfg.get("compile_baseline"):
        progress("torch.compile reference")
        try:
            compiled = torch.compile(model)

            def compiled_call():
                with torch.no_grad():
                    return compiled(*inputs)

            compiled_call()
            result["compiled_timing"] = {**time_callable(compiled_call, device=device, trials=cfg["perf_trials"],
                                                         warmup=cfg["warmup"], include_host=include_host,
                                                         hooks=TrialHooks()).to_dict(),
                                         "mode": result["timing_mode"]}
        except Exception as exc:
            result["compile_error"] = clip(describe_exception(exc))
    result["ok"] = True
    return result
