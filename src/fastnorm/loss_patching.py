"""fastnorm.patch's loss fusion: a Hugging Face causal language model's loss computed by
fastnorm.cross_entropy.

transformers' causal-LM loss (ForCausalLMLoss) copies the logits to float32 (for a 32000-word vocabulary
and 8192 tokens, 1 GB written and read back), takes log_softmax, gathers the targets, and in the backward
writes and reads float32 gradients of the same size before casting them back. fastnorm.cross_entropy reads
the logits once in their own dtype, computes in float32, and writes their gradient once. Recognized by
structure, never by name: a module whose class has transformers' settable `loss_function` property, whose
forward takes `labels` and calls that property, and whose loss function has ForCausalLMLoss's parameters and gives the same loss as
CausalLMLoss below on random probes (mean, sum over num_items_in_batch, given shift_labels). The model's
own `loss_function` is then set to a CausalLMLoss, which `unpatch` takes away again.
"""
import inspect
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from fastnorm.ops.loss_functional import cross_entropy

LOSS_PARAMETERS = ("logits", "labels", "vocab_size", "num_items_in_batch", "ignore_index", "shift_labels")
_PREVIOUS = "_fastnorm_previous_loss"  # on a patched model: (whether it had its own _loss_function, which)


class CausalLMLoss:
    """transformers' ForCausalLMLoss computed by fastnorm.cross_entropy: labels shifted by one position
    (or the given shift_labels), the mean over the tokens not ignored, or the sum divided by
    num_items_in_batch. Under torch.compile with `inductor_under_compile`, the original function: inductor
    compiles the patched model to the original's graph. Standalone, fastnorm's op is 1.3-1.8x faster than
    inductor's cross-entropy (benchmarks/results/h100-cross-entropy.txt), but inside the compiled Llama of
    the model suite the two measured level within 1% (benchmarks/NOTES.md, session 24)."""

    def __init__(self, original, inductor_under_compile: bool = False):
        self.original = original
        self.inductor_under_compile = inductor_under_compile

    def __call__(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                 **kwargs):
        if self.inductor_under_compile and torch.compiler.is_compiling():
            return self.original(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs)
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        rows = logits.reshape(-1, vocab_size)
        targets = shift_labels.reshape(-1).to(rows.device)
        if num_items_in_batch is None:
            return cross_entropy(rows, targets, ignore_index=ignore_index)
        loss = cross_entropy(rows, targets, ignore_index=ignore_index, reduction="sum")
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch

    def __repr__(self) -> str:
        return f"CausalLMLoss(original={getattr(self.original, '__name__', self.original)!r})"


def has_loss_slot(module: nn.Module) -> bool:
    """A module whose class has a settable `loss_function` (transformers' PreTrainedModel) and whose
    forward takes labels and calls that loss function: a model that computes its loss through it."""
    slot = getattr(type(module), "loss_function", None)
    if not isinstance(slot, property) or slot.fset is None:
        return False
    forward = inspect.unwrap(type(module).forward)  # transformers wraps forwards in decorators
    try:
        takes_labels = "labels" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    return takes_labels and "loss_function" in getattr(getattr(forward, "__code__", None), "co_names", ())


def why_not_fusable(module: nn.Module) -> Optional[str]:
    """None if the loss of `module` (has_loss_slot) can be CausalLMLoss, else why not."""
    if _PREVIOUS in vars(module):
        return "already fused"
    loss = module.loss_function
    try:
        names = list(inspect.signature(loss).parameters.values())
    except (TypeError, ValueError):
        return "its loss function's signature cannot be read"
    if (tuple(p.name for p in names[:len(LOSS_PARAMETERS)]) != LOSS_PARAMETERS
            or not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in names)):
        return f"its loss function {getattr(loss, '__name__', loss)!r} does not take a causal-LM loss's arguments"
    return _probe(module, loss)


def _probe(module: nn.Module, loss) -> Optional[str]:
    """None if `loss` gives CausalLMLoss's value on random probes on the model's device, else why not."""
    param = next(module.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    if device.type == "meta":
        return "parameters on the meta device: its loss cannot be checked (patch after loading weights)"
    if device.type not in ("cpu", "cuda"):
        return f"parameters on {device}: fastnorm runs on CPU and CUDA"
    gen = torch.Generator().manual_seed(0)
    vocab = 11
    logits = (torch.randn((2, 6, vocab), generator=gen) * 3).to(device)
    labels = torch.randint(0, vocab, (2, 6), generator=gen)
    labels[0, 2] = labels[1, 4] = -100
    labels = labels.to(device)
    shifted = torch.roll(labels, 1, dims=1)
    fused = CausalLMLoss(loss)
    for kwargs in (dict(), dict(num_items_in_batch=torch.tensor(7, device=device)), dict(shift_labels=shifted)):
        try:
            with torch.no_grad():
                expected = loss(logits=logits, labels=labels, vocab_size=vocab, **kwargs)
                got = fused(logits=logits, labels=labels, vocab_size=vocab, **kwargs)
        except Exception as error:
            return f"its loss function failed on a probe: {error}"
        if not isinstance(expected, torch.Tensor) or expected.shape != got.shape:
            return "its loss function does not return a loss of CausalLMLoss's shape"
        error = (expected.double() - got.double()).abs().max().item() / max(expected.double().abs().max().item(), 1.0)
        if not error <= 1e-5:  # NaN fails too
            return f"its loss is not a causal-LM cross-entropy: differs from fastnorm's by {error:.2g} (relative)"
    return None


def install(module: nn.Module, inductor_under_compile: bool) -> str:
    """Set the module's loss_function to a CausalLMLoss around its current one; returns the current one's name."""
    original = module.loss_function
    own = "_loss_function" in vars(module)
    module.__dict__[_PREVIOUS] = (own, vars(module).get("_loss_function"))
    module.loss_function = CausalLMLoss(original, inductor_under_compile)
    return getattr(original, "__name__", type(original).__name__)


def uninstall(module: nn.Module) -> bool:
    """Put back what install replaced; False where nothing was installed."""
    previous = vars(module).pop(_PREVIOUS, None)
    if previous is None:
        return False
    own, value = previous
    if own:
        module.loss_function = value
    else:
        vars(module).pop("_loss_function", None)
    return True
