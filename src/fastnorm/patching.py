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

GroupNorm -> SiLU pairs (with `family` and `fuse_silu`) become one fastnorm.GroupNorm(activation="silu")
pass where the structure shows the pair and the forward provably stays the same: in an nn.Sequential, a
GroupNorm immediately followed by an nn.SiLU (the SiLU's slot becomes an nn.Identity, so indices stay);
and in ResnetBlock2D-shaped blocks (diffusers' UNet / VAE), see _resnet_block_forward.

Hugging Face causal language models (with `fuse_loss`) compute their loss with fastnorm.cross_entropy, the
softmax normalization over the vocabulary in one pass: see loss_patching.
"""
import inspect
import math
import types
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import nn
from torch.func import functional_call

from fastnorm import family_modules, loss_patching
from fastnorm.modules import ORIGINAL as _ORIGINAL
from fastnorm.modules import ORIGINAL_EPS, LayerNorm, RMSNorm, rms_norm_reference
from fastnorm.ops.family_functional import group_norm
from fastnorm.ops.functional import layer_norm, rms_norm

_HALF = (torch.float16, torch.bfloat16)
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


def _variant_scale(weight, weight_offset: float):
    """The scale of an RMSNorm variant: weight, or weight + offset in fp32 (Gemma: 1 + w in bf16 would lose
    w); a temporary of one row, the parameter untouched and given its gradient through it."""
    return weight if weight_offset == 0 else weight.float() + weight_offset


def rms_norm_variant(x, normalized_shape, weight, eps, weight_offset: float = 0.0, dtype_rule: str = "input"):
    """RMSNorm of x scaled by `weight + weight_offset`, returning the dtype `dtype_rule` gives (see
    output_dtype). With matching dtypes it is one fused fastnorm call; mixed dtypes round where the
    variant they imitate rounds."""
    scale = _variant_scale(weight, weight_offset)
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
        if self._to_inductor(None):
            original = self._original_forward()
            if original is not None:
                return original(x)
            return rms_norm_reference(x, self.normalized_shape, self.weight, self.eps, self.weight_offset,
                                      output_dtype(self.dtype_rule, x.dtype, self.weight.dtype))
        return rms_norm_variant(x, self.normalized_shape, self.weight, self.eps, self.weight_offset, self.dtype_rule)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weight_offset={self.weight_offset}, dtype_rule={self.dtype_rule!r}"


_FUSED_SUFFIX = " (fused forward)"  # a Replaced entry's replacement: a block given a fused forward
_LOSS_REPLACEMENT = "fastnorm.cross_entropy"  # a Replaced entry's replacement: a model given fastnorm's loss


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

    @property
    def fused(self) -> List[Replaced]:
        """The entries of `replaced` that are blocks or layers given a fused forward (not norm modules)."""
        return [r for r in self.replaced if r.replacement.endswith(_FUSED_SUFFIX)]

    @property
    def losses(self) -> List[Replaced]:
        """The entries of `replaced` that are models whose loss fastnorm.cross_entropy computes now."""
        return [r for r in self.replaced if r.replacement == _LOSS_REPLACEMENT]

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
    new.__dict__[ORIGINAL_EPS] = getattr(new, "eps", None)
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


# ---- GroupNorm -> SiLU fusion ----------------------------------------------------------------------

_FUSED_FORWARD = "_fastnorm_fused_forward"  # marks a block whose forward patch set on the instance


def _plain_group_norm(module) -> bool:
    """An nn.GroupNorm or a fastnorm.GroupNorm without an activation (not another subclass)."""
    return type(module) is nn.GroupNorm or (type(module) is family_modules.GroupNorm and module.activation is None)


def _fused_group_norm(module: nn.GroupNorm) -> nn.Module:
    """fastnorm.GroupNorm(activation="silu") holding `module`'s parameters; unpatch puts back the
    original nn.GroupNorm (module itself, or what an earlier patch replaced)."""
    new = family_modules.GroupNorm(module.num_groups, module.num_channels, module.eps, module.affine, device="meta",
                                   activation="silu")
    _adopt(new, module, tuple(module._parameters))
    new.__dict__[_ORIGINAL] = vars(module).get(_ORIGINAL, module)
    return new


def _identity_for(module: nn.Module) -> nn.Module:
    new = nn.Identity()
    new.train(module.training)
    new.__dict__[_ORIGINAL] = module
    return new


def _sequential_pairs(model: nn.Module, skipped: list) -> dict:
    """{(id(parent), name): (replacement, note)} for each GroupNorm immediately followed by nn.SiLU in an
    nn.Sequential (its forward feeds each module's output to the next, nothing else sees the GroupNorm's
    output): the GroupNorm slot gets the fused module, the SiLU slot an nn.Identity."""
    overrides = {}
    for path, seq in model.named_modules(remove_duplicate=False):
        if type(seq) is not nn.Sequential:  # a subclass may have its own forward
            continue
        items = [(name, m) for name, m in seq._modules.items() if m is not None]
        for (gn_name, gn), (act_name, act) in zip(items, items[1:]):
            if not (_plain_group_norm(gn) and type(act) is nn.SiLU):
                continue
            try:
                _check_replaceable(gn)
                _check_replaceable(act)  # a hook on the SiLU would see nothing once it is an Identity
            except _Rejected as why:
                skipped.append(Skipped(f"{path}.{gn_name}" if path else gn_name, _class_name(gn),
                                       f"not fused with the SiLU after it: {why}"))
                continue
            overrides[(id(seq), gn_name)] = (_fused_group_norm(gn), f"fused with the SiLU at {act_name}")
            overrides[(id(seq), act_name)] = (_identity_for(act), f"SiLU fused into {gn_name}")
    return overrides


def _group_norm_silu(norm, x, nonlinearity):
    """nonlinearity(norm(x)) in one fused pass where norm is still a plain GroupNorm without hooks (added
    after patch, they must still run), else as written."""
    if _plain_group_norm(norm) and not (norm._forward_hooks or norm._forward_pre_hooks):
        return group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps, activation="silu")
    return nonlinearity(norm(x))


# diffusers' ResnetBlock2D (src/diffusers/models/resnet.py) computes
#   h = nonlinearity(norm1(x)); [up/downsample x and h]; h = conv1(h)
#   temb = time_emb_proj(nonlinearity(temb)) (nonlinearity skipped with skip_time_act)
#   "default": h = nonlinearity(norm2(h + temb));  "scale_shift": h = nonlinearity(norm2(h) * (1 + s) + t)
#   out = (conv_shortcut(x) + conv2(dropout(h))) / output_scale_factor
# The one `nonlinearity` module also activates temb, so it cannot become an Identity, and the GroupNorm
# modules cannot carry the SiLU themselves (the class forward would then apply it twice). Decision: keep
# norm1 / norm2 as (plain) fastnorm GroupNorms and set this forward on the instance: the same steps, with
# norm1 -> SiLU, and norm2 -> SiLU in "default" mode (in "scale_shift" the modulation sits in between:
# not fused), each one fused call. A call with more arguments (older diffusers' `scale`) runs the class
# forward, and patch only installs this forward after it matched the class forward on a probe.
_RESNET_CHILDREN = {"norm1", "norm2", "conv1", "conv2", "dropout", "nonlinearity", "time_emb_proj", "conv_shortcut",
                    "upsample", "downsample"}
_RESNET_ATTRIBUTES = ("time_emb_proj", "upsample", "downsample", "conv_shortcut", "skip_time_act",
                      "time_embedding_norm", "output_scale_factor")


def _resnet_block_forward(self, input_tensor, temb=None, *args, **kwargs):
    if args or kwargs or type(self.nonlinearity) is not nn.SiLU:
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)
    hidden = _group_norm_silu(self.norm1, input_tensor, self.nonlinearity)
    if self.upsample is not None:
        if hidden.shape[0] >= 64:
            input_tensor, hidden = input_tensor.contiguous(), hidden.contiguous()
        input_tensor, hidden = self.upsample(input_tensor), self.upsample(hidden)
    elif self.downsample is not None:
        input_tensor, hidden = self.downsample(input_tensor), self.downsample(hidden)
    hidden = self.conv1(hidden)
    if self.time_emb_proj is not None:
        if not self.skip_time_act:
            temb = self.nonlinearity(temb)
        temb = self.time_emb_proj(temb)[:, :, None, None]
    if self.time_embedding_norm == "default":
        if temb is not None:
            hidden = hidden + temb
        hidden = _group_norm_silu(self.norm2, hidden, self.nonlinearity)
    else:  # "scale_shift" (the only other mode patch accepts)
        if temb is None:
            raise ValueError(f"`temb` should not be None when `time_embedding_norm` is {self.time_embedding_norm}")
        time_scale, time_shift = torch.chunk(temb, 2, dim=1)
        hidden = self.nonlinearity(self.norm2(hidden) * (1 + time_scale) + time_shift)
    hidden = self.conv2(self.dropout(hidden))
    if self.conv_shortcut is not None:
        input_tensor = self.conv_shortcut(input_tensor.contiguous())
    return (input_tensor + hidden) / self.output_scale_factor


def _looks_like_resnet_block(module: nn.Module) -> Optional[str]:
    """None if `module` has ResnetBlock2D's structure (its children, attributes, GroupNorm norms and an
    nn.SiLU nonlinearity), else why not. Checked by structure, never by class name."""
    children = set(module._modules)
    if not {"norm1", "norm2", "conv1", "conv2", "dropout", "nonlinearity"} <= children:
        return "not ResnetBlock2D-shaped"
    if children - _RESNET_CHILDREN:
        return f"submodules {sorted(children - _RESNET_CHILDREN)} that ResnetBlock2D does not have"
    if any(not hasattr(module, name) for name in _RESNET_ATTRIBUTES):
        return "lacks ResnetBlock2D's attributes"
    if type(module.nonlinearity) is not nn.SiLU:
        return "nonlinearity is not nn.SiLU"
    if not (_plain_group_norm(module.norm1) and _plain_group_norm(module.norm2)):
        return "norm1 / norm2 are not nn.GroupNorm"
    if module.time_embedding_norm not in ("default", "scale_shift"):
        return f"time_embedding_norm {module.time_embedding_norm!r}"
    if _FUSED_FORWARD in vars(module):
        return "already fused"
    if "forward" in vars(module):
        return "its forward is replaced on the instance (e.g. by accelerate)"
    try:
        names = list(inspect.signature(module.forward).parameters)[:2]
    except (TypeError, ValueError):
        return "forward's signature cannot be read"
    if names != ["input_tensor", "temb"]:
        return f"forward{inspect.signature(module.forward)} is not (input_tensor, temb, ...)"
    for name in ("norm1", "norm2", "nonlinearity"):  # called no more (or not on the hidden states): hooks would be lost
        try:
            _check_replaceable(getattr(module, name))
        except _Rejected as why:
            return f"{name} {why}"
    return None


def _probe_resnet_block(block: nn.Module) -> None:
    """_Rejected unless _resnet_block_forward gives the class forward's output on a random probe (same
    random state for both runs, so dropout in training mode draws the same mask)."""
    weight = block.conv1.weight
    if weight.device.type == "meta":
        raise _Rejected("parameters on the meta device: its forward cannot be checked (patch after loading weights)")
    device, dtype = weight.device, weight.dtype
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((2, block.norm1.num_channels, 8, 8), generator=gen).to(device, dtype)
    temb = None
    if block.time_emb_proj is not None:
        features = getattr(block.time_emb_proj, "in_features", None)
        if not isinstance(features, int):
            raise _Rejected("time_emb_proj has no in_features: no probe for temb")
        temb = torch.randn((2, features), generator=gen).to(device, dtype)
    _check_fused_forward(block, _resnet_block_forward, (x, temb), {}, "ResnetBlock2D's")


def _check_fused_forward(module: nn.Module, fused_forward, args: tuple, kwargs: dict, kind: str,
                         not_tensor: str = "") -> None:
    """_Rejected unless fused_forward(module, *args, **kwargs) gives the class forward's tensor (same random
    state for both runs, so dropout in training mode draws the same mask), within a rounding of args[0]'s
    dtype. kind names what the class forward should be; not_tensor is said where it returns no tensor."""
    x = args[0]
    outputs = []
    for forward in (type(module).forward, fused_forward):
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(0)
            try:
                outputs.append(forward(module, *args, **kwargs))
            except Exception as error:
                raise _Rejected(f"forward failed on a probe of shape {tuple(x.shape)}: {error}") from None
    expected, got = outputs
    if not isinstance(expected, torch.Tensor):
        raise _Rejected(f"forward returns {type(expected).__name__}, not a tensor{not_tensor}")
    if expected.shape != got.shape:
        raise _Rejected("forward does not return a tensor of the fused forward's shape")
    error = _max_error(got, expected)
    if not error <= (3e-2 if x.dtype in _HALF else 1e-4):  # NaN fails too
        raise _Rejected(f"its forward is not {kind}: the fused forward differs by {error:.2g} (relative)")


def _fusable(model: nn.Module, has_slot, looks_like, probe, fusion: str, skipped: list, reported=None) -> list:
    """(path, module) of each module of `model` (itself included) with `has_slot(module)` whose structure
    check `looks_like` (None or why not) and `probe` (raises _Rejected) pass; the others go to `skipped` as
    "<fusion> not fused: why" where `reported(module)` (default: all), unless already fused."""
    found = []
    for path, module in model.named_modules():  # each module once, shared ones too
        if not has_slot(module):
            continue
        why_not = looks_like(module)
        if why_not is None:
            try:
                probe(module)
            except _Rejected as why:
                why_not = str(why)
            else:
                found.append((path or "(root)", module))
                continue
        if (reported is None or reported(module)) and why_not != "already fused":
            skipped.append(Skipped(path or "(root)", _class_name(module), f"{fusion} not fused: {why_not}"))
    return found


def _resnet_blocks(model: nn.Module, skipped: list) -> list:
    """(path, block) of every ResnetBlock2D-shaped module (the model itself included) whose probe passed."""
    return _fusable(model, lambda m: "nonlinearity" in m._modules, _looks_like_resnet_block, _probe_resnet_block,
                    "GroupNorm + SiLU", skipped, reported=lambda m: "norm1" in m._modules)

# transformers' pre-norm decoder layers (Llama, Qwen2, Qwen3, Mistral and their kind) compute
#   residual = h; h = self_attn(hidden_states=input_layernorm(h), <the forward's other arguments by name>)
#   h = residual + h; residual = h; h = post_attention_layernorm(h); return residual + mlp(h)
# The middle add and norm become one add_rms_norm / add_layer_norm call: one pass fewer in the forward,
# and its backward adds h's gradient from the last add in the same pass (no separate gradient sum).
# Installed on the instance only after the norms are replaced and only where this forward matched the
# class forward on a probe; a call it does not know (positional arguments, attention weights asked for)
# runs the class forward. Releases whose layers return tuples (older transformers) are left alone.
_DECODER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_INDUCTOR = "_fastnorm_inductor_under_compile"  # on a fused layer: under torch.compile, the class forward


def _add_norm(norm: nn.Module, x: torch.Tensor, residual: torch.Tensor):
    """(norm(residual + x), residual + x), in one fused call where `norm` is a fastnorm norm that can take
    it (no hooks, trailing dims, output in x's dtype), else as two steps."""
    fused = (type(norm) in (PatchedRMSNorm, RMSNorm, LayerNorm) and norm.dim is None and not norm.residual_in_fp32
             and not (norm._forward_hooks or norm._forward_pre_hooks)
             and x.dtype == residual.dtype and x.shape == residual.shape)
    if fused and type(norm) is PatchedRMSNorm:
        fused = output_dtype(norm.dtype_rule, x.dtype, norm.weight.dtype) == x.dtype
    if not fused:
        hidden = residual + x
        return norm(hidden), hidden
    if type(norm) is LayerNorm:
        return layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps, residual=residual)
    scale = _variant_scale(norm.weight, getattr(norm, "weight_offset", 0.0))
    return rms_norm(x, norm.normalized_shape, scale, norm.eps, residual=residual)


def _decoder_layer_forward(self, hidden_states, *args, **kwargs):
    if args or kwargs.get("output_attentions") or (vars(self).get(_INDUCTOR) and torch.compiler.is_compiling()):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    attention = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    if isinstance(attention, tuple):
        attention = attention[0]
    normed, hidden_states = _add_norm(self.post_attention_layernorm, attention, hidden_states)
    return hidden_states + self.mlp(normed)


def _looks_like_decoder_layer(module: nn.Module) -> Optional[str]:
    """None if `module` has a Llama-style decoder layer's structure (children, a forward taking
    hidden_states first, fastnorm norms in place), else why not. By structure, never by class name."""
    if set(module._modules) != _DECODER_CHILDREN:
        return "not a Llama-style decoder layer"
    if _FUSED_FORWARD in vars(module):
        return "already fused"
    if "forward" in vars(module):
        return "its forward is replaced on the instance (e.g. by accelerate)"
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return "forward's signature cannot be read"
    if names[:1] != ["hidden_states"]:
        return f"forward{inspect.signature(module.forward)} does not take hidden_states first"
    norm = module.post_attention_layernorm
    if not isinstance(norm, (LayerNorm, RMSNorm)):
        return "post_attention_layernorm was not replaced by a fastnorm norm"
    head_dim = getattr(module.self_attn, "head_dim", None)
    if not isinstance(head_dim, int) or not isinstance(module.post_attention_layernorm.weight, torch.Tensor):
        return "self_attn has no head_dim, or the norm no weight: no probe"
    return None


def _probe_decoder_layer(layer: nn.Module) -> None:
    """_Rejected unless _decoder_layer_forward gives the class forward's output (and the same tensor
    type) on a random probe of 2 sequences of 8 positions, rotary embeddings included."""
    weight = layer.post_attention_layernorm.weight
    if weight.device.type == "meta":
        raise _Rejected("parameters on the meta device: its forward cannot be checked (patch after loading weights)")
    device, dtype, hidden = weight.device, weight.dtype, weight.shape[-1]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((2, 8, hidden), generator=gen).to(device, dtype)
    angles = torch.randn((2, 8, layer.self_attn.head_dim), generator=gen).to(device, dtype)
    kwargs = dict(attention_mask=None, position_ids=torch.arange(8, device=device).expand(2, 8),
                  position_embeddings=(angles.cos(), angles.sin()))
    _check_fused_forward(layer, _decoder_layer_forward, (x,), kwargs, "a Llama-style layer's",
                         not_tensor=" (older transformers)")


def _fuse_decoder_layers(model: nn.Module, under_compile: str, replaced: list, skipped: list) -> None:
    """Install _decoder_layer_forward on each Llama-style decoder layer whose probe passed."""
    layers = _fusable(model, lambda m: "post_attention_layernorm" in m._modules, _looks_like_decoder_layer,
                      _probe_decoder_layer, "residual add", skipped)
    for path, module in layers:
        module.forward = types.MethodType(_decoder_layer_forward, module)
        module.__dict__[_FUSED_FORWARD] = True
        module.__dict__[_INDUCTOR] = under_compile == "inductor"
        replaced.append(Replaced(path, _class_name(module), _class_name(module) + _FUSED_SUFFIX,
                                 "residual add fused into post_attention_layernorm"))


def _fuse_losses(model: nn.Module, under_compile: str, replaced: list, skipped: list) -> None:
    """Give each causal language model in `model` (loss_patching) fastnorm.cross_entropy as its loss."""
    models = _fusable(model, loss_patching.has_loss_slot, loss_patching.why_not_fusable, lambda module: None,
                      "loss", skipped)  # why_not_fusable probes the loss itself
    for path, module in models:
        original = loss_patching.install(module, under_compile == "inductor")
        replaced.append(Replaced(path, original, _LOSS_REPLACEMENT,
                                 "the causal-LM loss in one pass over the logits, no float32 copy"))


UNDER_COMPILE = ("inductor", "kernels")


def patch(model: nn.Module, *, layer_norm: bool = True, rms_norm: bool = True, family: bool = True,
          fuse_silu: bool = True, fuse_residual: bool = True, fuse_loss: bool = True,
          under_compile: str = "inductor") -> PatchReport:
    """Replace, in place, the LayerNorm and RMSNorm modules of `model` (and, with `family`, its BatchNorm,
    InstanceNorm and GroupNorm modules) by fastnorm modules holding the same Parameter and buffer
    objects; return a PatchReport of what was replaced and what was left and why. With `family` and
    `fuse_silu`, GroupNorm -> SiLU pairs run as one fused pass where the structure shows them (module
    docstring). With `fuse_residual`, Llama-style decoder layers add their attention output to the
    residual inside post_attention_layernorm's kernel (_decoder_layer_forward). With `fuse_loss`, Hugging
    Face causal language models compute their loss with fastnorm.cross_entropy (loss_patching), after a
    probe shows their loss function is the causal-LM cross-entropy.

    `under_compile`: what the replaced LayerNorm / RMSNorm modules, fused layers and losses run inside
    torch.compile: "inductor" (PyTorch ops, which inductor fuses with the residual adds, casts and
    gradient sums around each norm: a compiled patched model runs like the compiled original) or
    "kernels" (fastnorm's kernels as custom ops). Eager calls always take fastnorm's kernels.
    `unpatch(model)` puts the original modules (and forwards) back."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastnorm.patch expects a torch.nn.Module, got {type(model).__name__}")
    if under_compile not in UNDER_COMPILE:
        raise ValueError(f"under_compile must be one of {UNDER_COMPILE}, got {under_compile!r}")
    replaced, skipped = [], []
    if _replacement_or_reason(model, layer_norm, rms_norm, family)[0] is not None:
        skipped.append(Skipped("(root)", _class_name(model), "the model itself is a norm: patch a module that holds it"))
    fuse = family and fuse_silu
    overrides = _sequential_pairs(model, skipped) if fuse else {}  # per slot: a shared GroupNorm elsewhere stays plain
    blocks = _resnet_blocks(model, skipped) if fuse else []
    done = {}  # id(original) -> (replacement, note): a shared module gets one replacement
    for path, parent, name, child in list(_child_slots(model)):
        override = overrides.get((id(parent), name))
        if override is not None:
            new, note = override
        else:
            if id(child) not in done:
                done[id(child)] = _replacement_or_reason(child, layer_norm, rms_norm, family)
            new, note = done[id(child)]
        if new is None:
            if note:
                skipped.append(Skipped(path, _class_name(child), note))
            continue
        if isinstance(new, (LayerNorm, RMSNorm)):
            new.inductor_under_compile = under_compile == "inductor"
        setattr(parent, name, new)
        replaced.append(Replaced(path, _class_name(child), _class_name(new), note))
    if fuse_residual:
        _fuse_decoder_layers(model, under_compile, replaced, skipped)
    if fuse_loss:
        _fuse_losses(model, under_compile, replaced, skipped)
    for path, block in blocks:
        block.forward = types.MethodType(_resnet_block_forward, block)
        block.__dict__[_FUSED_FORWARD] = True
        modes = "norm1" + (" and norm2" if block.time_embedding_norm == "default" else "")
        replaced.append(Replaced(path, _class_name(block), _class_name(block) + _FUSED_SUFFIX,
                                 f"{modes} fused with the SiLU after them"))
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
    for path, module in model.named_modules():
        if vars(module).pop(_FUSED_FORWARD, None):
            vars(module).pop("forward", None)
            vars(module).pop(_INDUCTOR, None)
            restored.append(path or "(root)")
        if loss_patching.uninstall(module):
            restored.append(f"{path or '(root)'} (loss)")
    return restored
