"""fastnorm.patch on real Hugging Face transformers models built from small configs (no downloads)."""
import pytest
import torch
from torch import nn

import fastnorm
from fastnorm.patching import PatchedRMSNorm
from test_patch import DTYPE_PAIRS, _assert_close

transformers = pytest.importorskip("transformers", reason="the transformers tests need `pip install transformers`")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128)
# family: (model class, config class, config kwargs, norm class name, replacement class)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", SMALL, "LlamaRMSNorm", PatchedRMSNorm),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", SMALL, "Qwen2RMSNorm", PatchedRMSNorm),
    "mistral": ("MistralForCausalLM", "MistralConfig", SMALL, "MistralRMSNorm", PatchedRMSNorm),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(SMALL, head_dim=16), "GemmaRMSNorm", PatchedRMSNorm),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=128, dropout_rate=0.0,
                decoder_start_token_id=0, pad_token_id=0),
           "T5LayerNorm", PatchedRMSNorm),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0), "LayerNorm", fastnorm.LayerNorm),
    "bert": ("BertForMaskedLM", "BertConfig",
             dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
             "LayerNorm", fastnorm.LayerNorm),
}
GENERATIVE = ["llama", "qwen2", "mistral", "gemma", "t5", "gpt2"]
DECODERS = ["llama", "qwen2", "mistral", "gemma"]  # Llama-style layers: the residual add fuses into a norm
CAUSAL_LMS = DECODERS + ["gpt2"]  # their loss is transformers' causal-LM loss: fastnorm.cross_entropy computes it
LAYERS = ["model.layers.0", "model.layers.1"]


def split_report(report):
    """(paths of replaced norms, paths of layers given a fused forward, paths of models given fastnorm's loss)."""
    fused, losses = [r.path for r in report.fused], [r.path for r in report.losses]
    return [r.path for r in report.replaced if r.path not in fused + losses], fused, losses


def expected_report(family, norms):
    return norms, LAYERS if family in DECODERS else [], ["(root)"] if family in CAUSAL_LMS else []


def build(family, device="cpu", dtype=torch.float32):
    """The family's small model with random norm parameters (ones would hide a mishandled weight), its
    norms' paths, and inputs with labels."""
    model_name, config_name, kwargs, norm_name, _ = FAMILIES[family]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).to(device, dtype)
    norms = [path for path, m in model.named_modules() if type(m).__name__ == norm_name]
    assert norms, f"no {norm_name} in {model_name}"
    with torch.no_grad():
        for path in norms:
            for p in model.get_submodule(path).parameters():
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if family == "gemma" else 1.0))
    ids = torch.randint(3, 128, (2, 8), device=device)
    inputs = dict(input_ids=ids, labels=ids)
    if family == "t5":
        inputs["decoder_input_ids"] = torch.randint(3, 128, (2, 5), device=device)
        inputs["labels"] = inputs["decoder_input_ids"]
    return model.eval(), norms, inputs


def logits(model, inputs):
    with torch.no_grad():
        return model(**{k: v for k, v in inputs.items() if k != "labels"}).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_logits_match_and_unpatch_restores(family):
    model, norms, inputs = build(family)
    expected = logits(model, inputs)
    params, keys = dict(model.named_parameters()), list(model.state_dict())
    originals = {path: model.get_submodule(path) for path in norms}
    report = fastnorm.patch(model)
    assert split_report(report) == expected_report(family, norms) and report.skipped == []
    assert all(type(model.get_submodule(path)) is FAMILIES[family][4] for path in norms)
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[name] for name, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    _assert_close(logits(model, inputs), expected)
    assert fastnorm.unpatch(model) == (norms + (["(root) (loss)"] if family in CAUSAL_LMS else [])
                                       + (LAYERS if family in DECODERS else []))
    assert "_loss_function" not in vars(model)
    assert all("forward" not in vars(model.get_submodule(path)) for path in LAYERS if family in DECODERS)
    assert all(model.get_submodule(path) is m for path, m in originals.items())
    assert torch.equal(logits(model, inputs), expected)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_step(family):
    model, norms, inputs = build(family)
    model.train()
    model(**inputs).loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    fastnorm.patch(model)
    assert all(model.get_submodule(path).training for path in norms)
    model(**inputs).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    norm_params = [name for name in grads if name.rsplit(".", 1)[0] in norms]
    assert norm_params
    scale = max(g.abs().max().item() for g in expected.values())  # some grads are rounding noise about 0
    for name in grads:
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-3, atol=1e-6 * scale)
    before = {name: model.get_parameter(name).detach().clone() for name in norm_params}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(model.get_parameter(name), before[name]) for name in norm_params)


@pytest.mark.parametrize("family", GENERATIVE)
def test_generate_same_tokens(family):
    model, _, inputs = build(family)
    ids = inputs["input_ids"]
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    fastnorm.patch(model)
    assert torch.equal(model.generate(ids, **kwargs), expected)


@pytest.mark.parametrize("family,under_compile", [("llama", "inductor"), ("llama", "kernels"), ("gemma", "inductor"),
                                                   ("gpt2", "kernels")])  # T5: 30 s here; test_patch compiles its norm
def test_torch_compile(family, under_compile):
    model, _, inputs = build(family)
    fastnorm.patch(model, under_compile=under_compile)
    expected = logits(model, inputs)
    torch._dynamo.reset()
    _assert_close(logits(torch.compile(model), inputs), expected)


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Names of the ops dispatched under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", DECODERS)
def test_fused_layers_take_the_fused_op(family):
    """Each Llama-style layer adds its attention output in add_rms_norm (and grads still match: see
    test_training_step); without fuse_residual none does."""
    counts = {}
    for fuse in (True, False):
        model, _, inputs = build(family)
        fastnorm.patch(model, fuse_residual=fuse)
        with OpRecorder() as recorder:
            model(**inputs).loss.backward()
        counts[fuse] = (recorder.ops.count("fastnorm.add_rms_norm"), recorder.ops.count("fastnorm.rms_norm"))
    assert counts == {True: (2, 3), False: (0, 5)}


def test_fused_layer_runs_the_class_forward_for_calls_it_does_not_know():
    model, _, inputs = build("llama")
    layer = model.model.layers[0]
    x = torch.randn(2, 8, 64)
    angles = torch.randn(2, 8, layer.self_attn.head_dim)
    position = (angles.cos(), angles.sin())
    expected = layer(x, None, position_embeddings=position)
    fastnorm.patch(model)
    with OpRecorder() as recorder:
        positional = layer(x, None, position_embeddings=position)  # a positional attention_mask
    assert "fastnorm.add_rms_norm" not in recorder.ops
    with OpRecorder() as recorder:
        keyword = layer(x, attention_mask=None, position_embeddings=position)
    assert "fastnorm.add_rms_norm" in recorder.ops
    _assert_close(positional, expected)
    _assert_close(keyword, expected)


@pytest.mark.parametrize("under_compile", ["inductor", "kernels"])
def test_what_torch_compile_sees(under_compile):
    """under_compile="inductor": the compiled graph holds PyTorch ops only, for inductor to fuse around
    the norms; "kernels": fastnorm's custom ops (fused residual ones included)."""
    model, _, inputs = build("llama")
    fastnorm.patch(model, under_compile=under_compile)
    expected = logits(model, inputs)
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    _assert_close(logits(torch.compile(model, backend=backend), inputs), expected)
    fastnorm_ops = sorted({t.removesuffix(".default") for t in targets if "fastnorm" in t})
    if under_compile == "inductor":
        assert fastnorm_ops == [] and any("rsqrt" in t for t in targets)
    else:
        assert fastnorm_ops == ["fastnorm.add_rms_norm", "fastnorm.rms_norm"]


def _compiled_targets(model, inputs):
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    logits(torch.compile(model, backend=backend), inputs)
    return sorted(targets)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_patched_model_compiles_to_the_unpatched_graph(family):
    """under_compile="inductor": each patched norm traces the forward of the module it replaced (it still
    holds the same Parameter objects and eps), so torch.compile sees the very ops of the unpatched model
    and inductor fuses them alike. A norm whose eps or weight changed since patch traces fastnorm's
    reference ops instead, with its own eps."""
    model, _, inputs = build(family)
    plain = _compiled_targets(model, inputs)
    fastnorm.patch(model)
    assert _compiled_targets(model, inputs) == plain
    norm = model.model.norm
    assert norm._original_forward() is not None
    norm.eps = 1e-2  # the original still has its own eps: the reference ops with this one
    assert norm._original_forward() is None
    expected = logits(model, inputs)
    torch._dynamo.reset()
    _assert_close(logits(torch.compile(model), inputs), expected)
    layer_norm = model.model.layers[0].input_layernorm
    layer_norm.weight = nn.Parameter(layer_norm.weight.detach() * 2)  # no longer the original's weight
    assert layer_norm._original_forward() is None
    expected = logits(model, inputs)
    torch._dynamo.reset()
    _assert_close(logits(torch.compile(model), inputs), expected)


@pytest.mark.parametrize("family", ["llama", "gemma", "t5"])
def test_bfloat16_model(family):
    model, _, inputs = build(family, dtype=torch.bfloat16)
    expected = logits(model, inputs)
    fastnorm.patch(model)
    y = logits(model, inputs)
    assert y.dtype == expected.dtype == torch.bfloat16
    # two layers of bf16: each norm rounds once where the original rounds twice
    assert (y.float() - expected.float()).abs().max() <= 0.05 * expected.float().abs().max()


RMS_CLASSES = [  # module path, class name, weight_offset, dtype_rule
    ("llama.modeling_llama", "LlamaRMSNorm", 0.0, "promote"),
    ("t5.modeling_t5", "T5LayerNorm", 0.0, "half_weight"),
    ("gemma.modeling_gemma", "GemmaRMSNorm", 1.0, "input"),
]


@pytest.mark.parametrize("where,name,offset,rule", RMS_CLASSES, ids=[c[1] for c in RMS_CLASSES])
@pytest.mark.parametrize("x_dtype,w_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
def test_library_rms_norm_dtypes(where, name, offset, rule, x_dtype, w_dtype):
    """Each class's own output dtype and rounding, including mixed input/weight dtypes."""
    module = pytest.importorskip(f"transformers.models.{where}")
    model = nn.Sequential(getattr(module, name)(32, eps=1e-6)).to(w_dtype)
    with torch.no_grad():
        model[0].weight.normal_(0.3, 0.5)
    x = torch.randn(3, 5, 32).to(x_dtype)
    expected = model(x)
    fastnorm.patch(model)
    assert (model[0].weight_offset, model[0].dtype_rule) == (offset, rule)
    _assert_close(model(x), expected, x_dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_on_cuda(family, dtype):
    model, norms, inputs = build(family, device="cuda", dtype=dtype)
    expected = logits(model, inputs)
    report = fastnorm.patch(model)
    assert split_report(report) == expected_report(family, norms) and report.skipped == []
    y = logits(model, inputs)
    assert y.dtype == expected.dtype and y.device == expected.device
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert (y.float() - expected.float()).abs().max() <= tol * expected.float().abs().max()
    if family in GENERATIVE and dtype == torch.float32:
        ids = inputs["input_ids"]
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
        patched = model.generate(ids, **kwargs)
        fastnorm.unpatch(model)
        assert torch.equal(patched, model.generate(ids, **kwargs))


# ---- the causal-LM loss (loss_patching) ----------------------------------------------------------------

@pytest.mark.parametrize("family", CAUSAL_LMS)
def test_loss_takes_fastnorm_cross_entropy(family):
    """The patched model's loss runs fastnorm.cross_entropy (forward and backward) and equals the original's,
    with labels that ignore positions and with num_items_in_batch (the Trainer's gradient accumulation)."""
    model, _, inputs = build(family)
    inputs["labels"] = inputs["labels"].clone()
    inputs["labels"][0, 2] = -100
    expected = [model(**inputs).loss, model(**inputs, num_items_in_batch=torch.tensor(9)).loss]
    fastnorm.patch(model)
    with OpRecorder() as recorder:
        loss = model(**inputs).loss
        loss.backward()
    assert {"fastnorm.cross_entropy", "fastnorm.cross_entropy_backward"} <= set(recorder.ops)
    got = [loss, model(**inputs, num_items_in_batch=torch.tensor(9)).loss]
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_fuse_loss_false_keeps_the_models_loss():
    model, _, inputs = build("llama")
    report = fastnorm.patch(model, fuse_loss=False)
    assert report.losses == [] and "_loss_function" not in vars(model)
    with OpRecorder() as recorder:
        model(**inputs).loss.backward()
    assert "fastnorm.cross_entropy" not in recorder.ops


def test_a_loss_that_is_no_causal_lm_cross_entropy_stays():
    """A user's own loss function with the same arguments (label smoothing here) fails the probe: it is
    reported and stays, and unpatch leaves it in place."""
    model, _, inputs = build("llama")

    def smoothed(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kw):
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab_size), labels.reshape(-1),
                                                 ignore_index=ignore_index, label_smoothing=0.1)

    model.loss_function = smoothed
    report = fastnorm.patch(model)
    assert report.losses == []
    assert [s.reason for s in report.skipped] == [
        s.reason for s in report.skipped if s.path == "(root)" and s.reason.startswith("loss not fused: its loss is not")]
    assert len(report.skipped) == 1 and model.loss_function is smoothed
    fastnorm.unpatch(model)
    assert model.loss_function is smoothed


def test_unpatch_restores_a_loss_function_the_user_set():
    model, _, inputs = build("llama")
    from transformers.loss.loss_utils import ForCausalLMLoss

    def own(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs):
        return ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs)

    model.loss_function = own
    report = fastnorm.patch(model)
    assert [r.path for r in report.losses] == ["(root)"] and model.loss_function.original is own
    assert fastnorm.patch(model).losses == []  # a second patch finds it fused already
    fastnorm.unpatch(model)
    assert model.loss_function is own


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("under_compile", ["inductor", "kernels"])
def test_compiled_training_step_with_the_fused_loss(device, under_compile):
    """Under torch.compile the loss is the original's ("inductor") or fastnorm's op ("kernels"): the same
    loss and gradients as the eager patched model either way, and the graph holds the op only with "kernels"."""
    model, _, inputs = build("llama", device=device)
    fastnorm.patch(model, under_compile=under_compile)
    model.train()
    loss = model(**inputs).loss
    loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return torch._inductor.compile(gm, example_inputs)

    compiled_loss = torch.compile(model, backend=backend)(**inputs).loss
    compiled_loss.backward()
    assert any("fastnorm.cross_entropy" in t for t in targets) == (under_compile == "kernels")
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-3, atol=1e-5)
