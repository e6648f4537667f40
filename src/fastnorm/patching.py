"""fastnorm.patch(model): put fastnorm modules in place of a model's normalization modules.

nn.LayerNorm and nn.RMSNorm are replaced by type, and so are nn.BatchNorm1d/2d/3d, nn.InstanceNorm1d/2d/3d
and nn.GroupNorm (not their subclasses, such as SyncBatchNorm: their own code would be lost). Other
RMSNorm classes (Hugging Face's LlamaRMSNorm, T5LayerNorm, GemmaRMSNorm, hand-written ones) are recognized
by structure, never by name: a leaf module whose only parameter is `weight`, with a numeric
`variance_epsilon` or `eps`, whose forward is shown to compute RMSNorm by running it next to a fastnorm
candidate on a small random probe. The probe also finds the variant: the scale `weight` or `1 + weight`
(Gemma), and which dtype the output takes when the input and weight dtypes differ. The replacement holds
the original's Parameter objects (nothing is copied, state_dict keys stay), its buffers (running
statistics, updated in place) and the original module itself, which `unpatch` puts back.
"""
import inspect
import math
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import nn
from torch.func import functional_call

from fastnorm import family_modules
from fastnorm.modules import LayerNorm, RMSNorm
from fastnorm.ops.functional import rms_norm

_HALF = (torch.float16, torch.bfloat16)
_ORIGINAL = "_fastnorm_original"  # attribute of a replacement: the module it stands in for
_TORCH_RMS_NORM = getattr(nn, "RMSNorm", None)  # torch >= 2.4
_EPS_NAMES = ("variance_epsilon", "eps")
_FAMILY = {nn.BatchNorm1d: family_modules.BatchNorm1d, nn.BatchNorm2d: family_modules.BatchNorm2d,
           nn.BatchNorm3d: family_modules.BatchNorm3d, nn.InstanceNorm1d: family_modules.InstanceNorm1d,
           nn.InstanceNorm2d: family_modules.InstanceNorm2d, nn.InstanceNorm3d: family_modules.InstanceNorm3d,
           nn.GroupNorm: family_modules.GroupNorm}  # torch.nn class -> its fastnorm subclass
_FASTNORM_MODULES = (LayerNorm, RMSNorm) + tuple(_FAMILY.values())
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


def output_dtype(rule: str, x_dtype: torch.dtype, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype an RMSNorm variant returns for input and weight dtypes:
    'input': the input's (nn.RMSNorm, Gemma: `(x * w).type_as(x)`);
    'promote': the promotion of both (Llama: `weight * x_normed.to(input_dtype)`);
    'half_weight': the weight's when it is fp16/bf16, else the promotion (T5LayerNorm)."""
    if rule == "input":
        return x_dtype
    if rule == "half_weight" and weight_dtype in _HALF:
        return weight_dtype
    return torch.promote_types(x_dtype, weight_dtype)


DTYPE_RULES = ("input", "promote", "half_weight")


def rms_norm_variant(x, normalized_shape, weight, eps, weight_offset: float = 0.0, dtype_rule: str = "input"):
    """RMSNorm of x scaled by `weight + weight_offset`, returning the dtype `dtype_rule` gives (see
    output_dtype). With matching dtypes it is one fused fastnorm call; mixed dtypes round where the
    variant they imitate rounds."""
    # Gemma adds the offset in fp32 (1 + w in bf16 would lose w); a temporary of one row, the
    # parameter is untouched and gets its gradient through it.
    scale = weight if weight_offset == 0 else weight.float() + weight_offset
    out = output_dtype(dtype_rule, x.dtype, weight.dtype)
    if out == x.dtype:
        return rms_norm(x, normalized_shape, scale, eps)
    if dtype_rule == "promote" or out in _HALF:  # normalized at the input's precision, then scaled
        return (rms_norm(x, normalized_shape, None, eps).to(out) * scale).to(out)
    return rms_norm(x.to(out), normalized_shape, scale, eps)  # T5 with a wider weight: all in its dtype


class PatchedRMSNorm(RMSNorm):
    """fastnorm.RMSNorm standing in for a model library's RMSNorm class: same `weight`, the same eps
    (also readable as `variance_epsilon`), and the variant's scale (`weight + weight_offset`) and
    output dtype rule (see output_dtype)."""

    def __init__(self, normalized_shape, eps: float, *, weight_offset: float = 0.0, dtype_rule: str = "input",
                 device=None, dtype=None):
        if dtype_rule not in DTYPE_RULES:
            raise ValueError(f"dtype_rule must be one of {DTYPE_RULES}, got {dtype_rule!r}")
        super().__init__(normalized_shape, eps, elementwise_affine=True, device=device, dtype=dtype)
        self.weight_offset = float(weight_offset)
        self.dtype_rule = dtype_rule

    @property
    def variance_epsilon(self) -> float:  # the name Llama/T5 code uses
        return self.eps

    @variance_epsilon.setter
    def variance_epsilon(self, value: float) -> None:
        self.eps = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_variant(x, self.normalized_shape, self.weight, self.eps, self.weight_offset, self.dtype_rule)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weight_offset={self.weight_offset}, dtype_rule={self.dtype_rule!r}"


class Replaced(NamedTuple):
    path: str
    original: str  # class name
    replacement: str
    note: str


class Skipped(NamedTuple):
    path: str
    module: str  # class name
    reason: str


class PatchReport:
    """What `patch` replaced (`.replaced`) and what it left and why (`.skipped`); print it."""

    def __init__(self, replaced: List[Replaced], skipped: List[Skipped]):
        self.replaced = replaced
        self.skipped = skipped

    def __str__(self) -> str:
        lines = [f"fastnorm.patch: replaced {len(self.replaced)} module(s), left {len(self.skipped)}"]
        lines += [f"  replaced {r.path}: {r.original} -> {r.replacement}" + (f" ({r.note})" if r.note else "")
                  for r in self.replaced]
        lines += [f"  left     {s.path}: {s.module}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"PatchReport(replaced={len(self.replaced)}, skipped={len(self.skipped)})"


class _Rejected(Exception):
    """A module fastnorm leaves alone; the message says why."""


def _class_name(module: nn.Module) -> str:
    """nn.LayerNorm, fastnorm.LayerNorm, fastnorm.patching.PatchedRMSNorm, LlamaRMSNorm: unambiguous, short."""
    kind = type(module)
    if kind.__module__.startswith("torch.nn."):
        return f"nn.{kind.__qualname__}"
    if kind.__module__.startswith("fastnorm."):
        return f"{kind.__module__.replace('.modules', '')}.{kind.__qualname__}"
    return kind.__qualname__


def _check_replaceable(module: nn.Module) -> None:
    """Refuse modules whose replacement would silently drop something attached to the instance."""
    hooks = [name for name in _HOOK_DICTS if getattr(module, name, None)]
    if hooks:
        raise _Rejected(f"has hooks ({', '.join(hooks)}), which a replacement would drop")
    if "forward" in vars(module):
        raise _Rejected("its forward is replaced on the instance (e.g. by accelerate), which a replacement would drop")
    params = [p for p in module.parameters(recurse=False) if p is not None]
    devices = {p.device.type for p in params}
    if devices - {"cpu", "cuda", "meta"}:  # meta: a model to be materialized later
        raise _Rejected(f"parameters on {sorted(devices)}: fastnorm runs on CPU and CUDA")


def _adopt(new: nn.Module, original: nn.Module, names: Tuple[str, ...]) -> nn.Module:
    """Give `new` (built on the meta device) the original's Parameter (and buffer) objects, mode and a
    link back."""
    for name in names:
        setattr(new, name, getattr(original, name))
    new.train(original.training)
    new.__dict__[_ORIGINAL] = original  # a plain attribute: not a submodule, not in state_dict
    return new


def _layer_norm_replacement(module: nn.LayerNorm) -> nn.Module:
    new = LayerNorm(module.normalized_shape, module.eps, module.elementwise_affine, bias=module.bias is not None,
                    device="meta")
    return _adopt(new, module, ("weight", "bias"))


def _rms_norm_replacement(module) -> nn.Module:  # nn.RMSNorm: torch >= 2.4
    new = RMSNorm(module.normalized_shape, module.eps, module.elementwise_affine, device="meta")
    return _adopt(new, module, ("weight",))


def _family_replacement(module) -> nn.Module:
    """The fastnorm subclass of a BatchNorm, InstanceNorm or GroupNorm, with its parameters and buffers."""
    kind = _FAMILY[type(module)]
    if isinstance(module, nn.GroupNorm):
        new = kind(module.num_groups, module.num_channels, module.eps, module.affine, device="meta")
    else:
        new = kind(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                   device="meta")
    return _adopt(new, module, tuple(module._parameters) + tuple(module._buffers))


def _epsilon(module: nn.Module) -> Optional[float]:
    for name in _EPS_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def _looks_like_rms_norm(module: nn.Module) -> Optional[str]:
    """None if `module` has RMSNorm's structure (a leaf with one parameter `weight` and an eps), else why not."""
    params = [name for name, _ in module.named_parameters(recurse=False)]
    if next(module.children(), None) is not None:
        return "has submodules"
    if params != ["weight"]:
        return f"parameters {params}, not just `weight`"
    if next(module.buffers(recurse=False), None) is not None:
        return "has buffers"
    if not module.weight.is_floating_point() or module.weight.dim() == 0:
        return "weight is not a floating-point vector"
    if _epsilon(module) is None:
        return "no numeric `variance_epsilon` or `eps` attribute"
    return _forward_takes_one_input(module)


def _forward_takes_one_input(module: nn.Module) -> Optional[str]:
    """None if forward takes exactly one argument, else why not: the replacement takes only x, so a
    forward such as (x, gate=None) must stay, even though a probe of forward(x) alone would pass."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return "forward's signature cannot be read"
    one_input = (len(params) == 1 and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                         inspect.Parameter.POSITIONAL_OR_KEYWORD))
    return None if one_input else f"forward{inspect.signature(module.forward)} takes more than the input"


def _probe_input(shape, eps: float, generator: torch.Generator) -> torch.Tensor:
    """(2, 3, *shape) rows at different scales, some near sqrt(eps) so a wrong eps shows."""
    x = torch.randn((2, 3) + shape, generator=generator)
    root = math.sqrt(eps) if eps > 0 else 1.0
    scales = torch.tensor([1.0, 7.0, 0.3 * root, root, 3 * root, 0.05])
    return x * scales.view((2, 3) + (1,) * len(shape))


def _max_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| relative to max(|ref|, 1)."""
    diff = (y.double() - ref.double()).abs().max().item()
    return diff / max(ref.double().abs().max().item(), 1.0)


def _run(module, weight, x):
    """module(x) with `weight` in place of its parameter, which stays untouched."""
    with torch.no_grad():
        return functional_call(module, {"weight": weight}, (x,))


def _check_output(y, x) -> None:
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise _Rejected("forward does not return a tensor of the input's shape")


def _probe_rms_variant(module: nn.Module, eps: float) -> Tuple[float, str]:
    """(weight_offset, dtype_rule) of the RMSNorm `module` computes, found by running it on probes;
    _Rejected if its forward is no RMSNorm variant fastnorm reproduces."""
    weight = module.weight
    if weight.device.type == "meta":
        raise _Rejected("parameters on the meta device: its forward cannot be checked (patch after loading weights)")
    shape, device = tuple(weight.shape), weight.device
    gen = torch.Generator().manual_seed(0)  # a private generator: the caller's random state is untouched
    x = _probe_input(shape, eps, gen).to(device)
    w = (torch.randn(shape, generator=gen) * 0.5 + 0.3).to(device)
    try:
        y = _run(module, w, x)
    except Exception as error:
        raise _Rejected(f"forward failed on a float32 probe of shape {tuple(x.shape)}: {error}") from None
    _check_output(y, x)
    errors = {}
    for offset in (0.0, 1.0):
        errors[offset] = _max_error(rms_norm_variant(x, shape, w, eps, offset), y)
        if errors[offset] <= 1e-4:
            break
    else:
        raise _Rejected("forward is not RMSNorm over the weight's dims: relative error "
                        f"{errors[0.0]:.2g} against x/rms(x) * weight, {errors[1.0]:.2g} against * (1 + weight)")
    x = torch.randn(x.shape, generator=gen).to(device)  # plain rows: fp16 keeps their squares
    return offset, _probe_dtype_rule(module, x, w, eps, offset)


def _probe_dtype_rule(module, x, w, eps: float, offset: float) -> str:
    """The output dtype rule of `module` from probes in mixed dtypes (probes it fails on do not count),
    each checked against the fastnorm variant with that rule."""
    runs = []
    for x_dtype, w_dtype in ((torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                             (torch.float16, torch.bfloat16)):
        xp, wp = x.to(x_dtype), w.to(w_dtype)
        try:
            y = _run(module, wp, xp)
        except Exception:  # e.g. a module that insists on one dtype: those calls need no rule
            continue
        _check_output(y, xp)
        runs.append((xp, wp, y))
    rule = next((r for r in DTYPE_RULES
                 if all(y.dtype == output_dtype(r, xp.dtype, wp.dtype) for xp, wp, y in runs)), None)
    if rule is None:
        seen = ", ".join(f"{_short(xp.dtype)} x {_short(wp.dtype)} weight -> {_short(y.dtype)}" for xp, wp, y in runs)
        raise _Rejected(f"output dtypes ({seen}) follow none of the rules {DTYPE_RULES}")
    for xp, wp, y in runs:
        error = _max_error(rms_norm_variant(xp, tuple(wp.shape), wp, eps, offset, rule), y)
        if error > 3e-2:  # a few ulps of bf16
            raise _Rejected(f"differs from fastnorm by {error:.2g} (relative) on {_short(xp.dtype)} input "
                            f"with a {_short(wp.dtype)} weight")
    return rule


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _generic_rms_replacement(module: nn.Module) -> Tuple[nn.Module, str]:
    eps = _epsilon(module)
    offset, rule = _probe_rms_variant(module, eps)
    new = PatchedRMSNorm(tuple(module.weight.shape), eps, weight_offset=offset, dtype_rule=rule, device="meta")
    note = ("scale 1 + weight, " if offset else "") + f"output dtype rule {rule!r}"
    return _adopt(new, module, ("weight",)), note


def _replacement(module: nn.Module, layer_norm: bool, rms_norm: bool, family: bool) -> Tuple[Optional[nn.Module], str]:
    """(replacement, note), or (None, reason) for a norm-like module left alone, or (None, '') for a
    module that is no normalization at all. Raises _Rejected for a recognized one that cannot be."""
    kind = type(module)
    if isinstance(module, _FASTNORM_MODULES):
        return None, "already a fastnorm module"
    if kind in _FAMILY:
        if not family:
            return None, "family=False"
        _check_replaceable(module)
        return _family_replacement(module), ""
    if kind is nn.LayerNorm:
        if not layer_norm:
            return None, "layer_norm=False"
        _check_replaceable(module)
        return _layer_norm_replacement(module), ""
    if kind is _TORCH_RMS_NORM:
        if not rms_norm:
            return None, "rms_norm=False"
        _check_replaceable(module)
        return _rms_norm_replacement(module), ""
    if isinstance(module, nn.LayerNorm):
        return None, "a subclass of nn.LayerNorm, whose own code fastnorm.LayerNorm would drop"
    why_not = _looks_like_rms_norm(module)
    if why_not is not None:
        named_norm = "norm" in kind.__name__.lower()  # reported, not recognized, by name
        return None, (f"not LayerNorm/RMSNorm-shaped: {why_not}" if named_norm else "")
    if not rms_norm:
        return None, "rms_norm=False"
    _check_replaceable(module)
    return _generic_rms_replacement(module)


def _replacement_or_reason(module, layer_norm, rms_norm, family):
    try:
        return _replacement(module, layer_norm, rms_norm, family)
    except _Rejected as why:
        return None, str(why)


def _child_slots(parent: nn.Module, prefix: str = ""):
    """(path, parent, name, child) for every submodule slot in named_modules order, a shared module
    at each of its paths."""
    for name, child in parent._modules.items():
        if child is None:
            continue
        path = f"{prefix}.{name}" if prefix else name
        yield path, parent, name, child
        yield from _child_slots(child, path)


def patch(model: nn.Module, *, layer_norm: bool = True, rms_norm: bool = True, family: bool = True) -> PatchReport:
    """Replace, in place, the LayerNorm and RMSNorm modules of `model` (and, with `family`, its BatchNorm,
    InstanceNorm and GroupNorm modules) by fastnorm modules holding the same Parameter and buffer
    objects; return a PatchReport of what was replaced and what was left and why.
    `unpatch(model)` puts the original modules back."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastnorm.patch expects a torch.nn.Module, got {type(model).__name__}")
    replaced, skipped = [], []
    if _replacement_or_reason(model, layer_norm, rms_norm, family)[0] is not None:
        skipped.append(Skipped("(root)", _class_name(model), "the model itself is a norm: patch a module that holds it"))
    done = {}  # id(original) -> (replacement, note): a shared module gets one replacement
    for path, parent, name, child in list(_child_slots(model)):
        if id(child) not in done:
            done[id(child)] = _replacement_or_reason(child, layer_norm, rms_norm, family)
        new, note = done[id(child)]
        if new is None:
            if note:
                skipped.append(Skipped(path, _class_name(child), note))
            continue
        setattr(parent, name, new)
        replaced.append(Replaced(path, _class_name(child), _class_name(new), note))
    return PatchReport(replaced, skipped)


def unpatch(model: nn.Module) -> List[str]:
    """Put back the original modules `patch` replaced in `model` (with the replacements' current
    Parameter and buffer objects and training mode); return their paths."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastnorm.unpatch expects a torch.nn.Module, got {type(model).__name__}")
    restored = []
    for path, parent, name, child in list(_child_slots(model)):
        original = vars(child).get(_ORIGINAL)
        if original is None:
            continue
        # the same objects, even if something swapped them meanwhile (module.to() replaces buffers)
        tensors = list(child.named_parameters(recurse=False)) + list(child.named_buffers(recurse=False))
        for attr, tensor in tensors:
            setattr(original, attr, tensor)
        original.train(child.training)
        setattr(parent, name, original)
        restored.append(path)
    return restored
