"""fastnorm.patch / unpatch on plain torch modules and hand-written RMSNorm classes (no transformers)."""
import copy

import pytest
import torch
from torch import nn

import fastnorm
from conftest import needs_torch_rms_norm
from fastnorm.patching import PatchedRMSNorm, PatchReport, Replaced, Skipped


# Hand-written norms in the styles of model libraries (same arithmetic, no import).
class LlamaStyleRMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class GemmaStyleRMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class T5StyleRMSNorm(LlamaStyleRMSNorm):  # same parameters, T5LayerNorm's forward
    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class PlainRMSNorm(nn.Module):
    """Computes in the input's dtype, returns the promotion of input and weight dtypes."""

    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MeanAbsNorm(nn.Module):
    """RMSNorm's structure, not its forward: divides by mean |x|."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return self.weight * x / (x.abs().mean(-1, keepdim=True) + self.eps)


class WrongEpsRMSNorm(LlamaStyleRMSNorm):
    """Says eps 1e-6, uses 1e-5: only probe rows near sqrt(eps) tell."""

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class GatedRMSNorm(LlamaStyleRMSNorm):
    """Passes the probe on forward(x), but callers pass a gate the replacement could not take."""

    def forward(self, x, gate=None):
        return super().forward(x if gate is None else x * gate)


class BiasedNorm(nn.Module):  # 'Norm' in the name but two parameters: reported, not replaced
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.eps = 1e-6

    def forward(self, x):
        return x * self.weight + self.bias


STYLES = [  # class, expected weight_offset, expected dtype_rule
    (LlamaStyleRMSNorm, 0.0, "promote"),
    (GemmaStyleRMSNorm, 1.0, "input"),
    (T5StyleRMSNorm, 0.0, "half_weight"),
    (PlainRMSNorm, 0.0, "promote"),
]
STYLE_IDS = [cls.__name__ for cls, _, _ in STYLES]
# (input dtype, weight dtype): matching, and the mixes where the dtype rules differ
DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
               (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16), (torch.float16, torch.bfloat16)]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _randomize(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + 0.5)


def _assert_close(y, ref, x_dtype=torch.float32):
    """Same dtype and shape, values within the tolerance of the output's or the input's dtype, whichever
    is less precise (some originals compute in the input's dtype)."""
    assert y.dtype == ref.dtype and y.shape == ref.shape
    scale = max(ref.double().abs().max().item(), 1.0)
    tol = max(TOL[ref.dtype], TOL[x_dtype])
    assert (y.double() - ref.double()).abs().max().item() <= tol * scale


def _params(model):
    return {name: p for name, p in model.named_parameters()}


@needs_torch_rms_norm
def test_replaces_torch_layer_norm_and_rms_norm():
    model = nn.Sequential(nn.LayerNorm(8), nn.LayerNorm(8, bias=False), nn.LayerNorm(8, elementwise_affine=False),
                          nn.Linear(8, 8), nn.RMSNorm(8), nn.RMSNorm(8, eps=1e-3, elementwise_affine=False),
                          nn.Sequential(nn.LayerNorm((3, 8), eps=1e-3)), nn.RMSNorm((3, 8)))
    _randomize(model)
    model[0].weight.requires_grad_(False)
    model[4].eval()
    x = torch.randn(4, 3, 8)
    expected = model(x)
    params, state = _params(model), model.state_dict()
    report = fastnorm.patch(model)
    kinds = [type(model[i]) for i in (0, 1, 2, 4, 5)] + [type(model[6][0]), type(model[7])]
    assert kinds == [fastnorm.LayerNorm] * 3 + [fastnorm.RMSNorm] * 2 + [fastnorm.LayerNorm, fastnorm.RMSNorm]
    assert type(model[3]) is nn.Linear
    assert [r.path for r in report.replaced] == ["0", "1", "2", "4", "5", "6.0", "7"]
    assert report.skipped == []
    new_params = _params(model)
    assert list(new_params) == list(params) and all(new_params[k] is params[k] for k in params)
    assert list(model.state_dict()) == list(state)
    assert model[1].bias is None and model[2].weight is None and model[5].weight is None
    assert model[5].eps == 1e-3 and model[6][0].normalized_shape == (3, 8) and model[6][0].eps == 1e-3
    assert not model[0].weight.requires_grad and model[1].weight.requires_grad
    assert not model[4].training and model[0].training
    _assert_close(model(x), expected)


@pytest.mark.parametrize("style,offset,rule", STYLES, ids=STYLE_IDS)
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
def test_hand_written_rms_norm(style, offset, rule, x_dtype, w_dtype):
    model = nn.Sequential(style(16)).to(w_dtype)
    _randomize(model)
    x = torch.randn(5, 7, 16).to(x_dtype)
    expected = model(x)
    weight = model[0].weight
    report = fastnorm.patch(model)
    norm = model[0]
    assert type(norm) is PatchedRMSNorm and norm.weight is weight
    assert (norm.weight_offset, norm.dtype_rule) == (offset, rule)
    assert norm.variance_epsilon == norm.eps == (1e-6 if style is not PlainRMSNorm else 1e-5)
    assert report.replaced == [Replaced("0", style.__name__, "fastnorm.patching.PatchedRMSNorm", report.replaced[0].note)]
    _assert_close(model(x), expected, x_dtype)


@pytest.mark.parametrize("style,offset,rule", STYLES, ids=STYLE_IDS)
def test_gradients_match(style, offset, rule):
    model = nn.Sequential(nn.Linear(16, 16), style(16))
    _randomize(model)
    x = torch.randn(6, 16)
    model(x).square().sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    fastnorm.patch(model)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impostor,reason", [(MeanAbsNorm, "not RMSNorm"), (WrongEpsRMSNorm, "not RMSNorm"),
                                             (BiasedNorm, "not just `weight`"),
                                             (GatedRMSNorm, "forward(x, gate=None) takes more than the input")])
def test_look_alikes_are_left_alone(impostor, reason):
    model = nn.Sequential(nn.Linear(8, 8), impostor(8))
    original = model[1]
    report = fastnorm.patch(model)
    assert model[1] is original and report.replaced == []
    assert [(s.path, s.module) for s in report.skipped] == [("1", impostor.__name__)]
    assert reason in report.skipped[0].reason


@needs_torch_rms_norm
def test_flags_leave_one_kind():
    model = nn.Sequential(nn.LayerNorm(8), nn.RMSNorm(8), LlamaStyleRMSNorm(8))
    report = fastnorm.patch(model, layer_norm=False)
    assert type(model[0]) is nn.LayerNorm and type(model[1]) is fastnorm.RMSNorm and type(model[2]) is PatchedRMSNorm
    assert report.skipped == [Skipped("0", "nn.LayerNorm", "layer_norm=False")]
    fastnorm.unpatch(model)
    report = fastnorm.patch(model, rms_norm=False)
    assert type(model[0]) is fastnorm.LayerNorm and type(model[1]) is nn.RMSNorm and type(model[2]) is LlamaStyleRMSNorm
    assert [(s.path, s.reason) for s in report.skipped] == [("1", "rms_norm=False"), ("2", "rms_norm=False")]


@needs_torch_rms_norm
def test_unpatch_restores_the_original_modules():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), GemmaStyleRMSNorm(8), nn.RMSNorm(8))
    _randomize(model)
    originals = list(model)
    x = torch.randn(3, 8)
    expected = model(x)
    fastnorm.patch(model)
    again = fastnorm.patch(model)  # already patched: nothing to do
    assert again.replaced == [] and {s.reason for s in again.skipped} == {"already a fastnorm module"}
    model.train(False)
    assert fastnorm.unpatch(model) == ["1", "2", "3"]
    assert all(a is b for a, b in zip(model, originals))
    assert not any(m.training for m in model)
    assert torch.equal(model(x), expected)
    assert fastnorm.unpatch(model) == []


def test_unpatch_after_conversion_keeps_the_new_parameters():
    model = nn.Sequential(nn.LayerNorm(8), LlamaStyleRMSNorm(8))
    _randomize(model)
    fastnorm.patch(model)
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # .double() makes new Parameters
    try:
        model.double()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
    fastnorm.unpatch(model)
    x = torch.randn(2, 8, dtype=torch.float64)
    assert model[0].weight.dtype == model[1].weight.dtype == torch.float64
    assert model(x).dtype == torch.float64


def test_shared_module_gets_one_replacement():
    norm = LlamaStyleRMSNorm(8)
    model = nn.ModuleDict({"a": nn.Sequential(norm), "b": nn.Sequential(norm)})
    report = fastnorm.patch(model)
    assert model["a"][0] is model["b"][0] and type(model["a"][0]) is PatchedRMSNorm
    assert [r.path for r in report.replaced] == ["a.0", "b.0"]
    fastnorm.unpatch(model)
    assert model["a"][0] is norm and model["b"][0] is norm


def test_modules_that_cannot_be_replaced():
    hooked = nn.LayerNorm(8)
    hooked.register_forward_hook(lambda m, i, o: None)
    on_meta = LlamaStyleRMSNorm(8).to("meta")
    model = nn.Sequential(hooked, on_meta, nn.LayerNorm(8, device="meta"), nn.LocalResponseNorm(2),
                          nn.Linear(8, 8))
    report = fastnorm.patch(model)
    reasons = {s.path: s.reason for s in report.skipped}
    assert set(reasons) == {"0", "1", "3"}  # the Linear is no norm: not reported
    assert "hooks" in reasons["0"] and "meta device" in reasons["1"] and "not just `weight`" in reasons["3"]
    assert [r.path for r in report.replaced] == ["2"]  # nn.LayerNorm needs no probe, meta is fine
    assert model[2].weight.device.type == "meta"


def test_variance_epsilon_is_eps():
    model = nn.Sequential(LlamaStyleRMSNorm(8, eps=1e-5))
    fastnorm.patch(model)
    assert model[0].variance_epsilon == model[0].eps == 1e-5
    model[0].variance_epsilon = 1e-3
    assert model[0].eps == 1e-3


@needs_torch_rms_norm
def test_root_norm_is_reported():
    norm = nn.RMSNorm(8)
    report = fastnorm.patch(norm)
    assert report.replaced == [] and [s.path for s in report.skipped] == ["(root)"]


def test_bad_argument():
    with pytest.raises(TypeError, match="nn.Module"):
        fastnorm.patch(torch.ones(3))
    with pytest.raises(TypeError, match="nn.Module"):
        fastnorm.unpatch("model")
    with pytest.raises(ValueError, match="dtype_rule"):
        PatchedRMSNorm(8, 1e-6, dtype_rule="weight")


def test_report_prints_paths_and_reasons():
    model = nn.Sequential(nn.LayerNorm(8), MeanAbsNorm(8))
    report = fastnorm.patch(model)
    assert isinstance(report, PatchReport) and repr(report) == "PatchReport(replaced=1, skipped=1)"
    text = str(report)
    assert text.splitlines()[0] == "fastnorm.patch: replaced 1 module(s), left 1"
    assert "replaced 0: nn.LayerNorm -> fastnorm.LayerNorm" in text
    assert "left     1: MeanAbsNorm: forward is not RMSNorm" in text


def test_probe_leaves_the_random_state_alone():
    model = nn.Sequential(LlamaStyleRMSNorm(8))
    state = torch.get_rng_state()
    fastnorm.patch(model)
    assert torch.equal(torch.get_rng_state(), state)


def test_compiled_patched_model_has_no_graph_break():
    model = nn.Sequential(nn.Linear(16, 16), LlamaStyleRMSNorm(16), GemmaStyleRMSNorm(16), T5StyleRMSNorm(16),
                          nn.LayerNorm(16))
    _randomize(model)
    fastnorm.patch(model)
    x = torch.randn(4, 16)
    compiled = torch.compile(copy.deepcopy(model), fullgraph=True, backend="eager")
    _assert_close(compiled(x), model(x))


@needs_torch_rms_norm
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_on_cuda(dtype):
    model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), LlamaStyleRMSNorm(64), GemmaStyleRMSNorm(64),
                          T5StyleRMSNorm(64), nn.RMSNorm(64)).to("cuda", dtype)
    _randomize(model)
    x = torch.randn(8, 64, device="cuda", dtype=dtype)
    expected = model(x)
    inputs = [x]  # each layer's input in the original chain
    for layer in list(model)[:-1]:
        inputs.append(layer(inputs[-1]))
    expected_layers = [layer(h) for layer, h in zip(model, inputs)]
    report = fastnorm.patch(model)
    assert len(report.replaced) == 5 and report.skipped == []
    assert all(p.device.type == "cuda" for p in model.parameters())
    for layer, h, e in zip(model, inputs, expected_layers):  # each norm on its original's input
        _assert_close(layer(h), e)
    _assert_close(model(x), expected)  # the chain (bf16 nn.RMSNorm with eps None failed it before default_rms_eps)

