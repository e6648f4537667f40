"""What a bench row times: the forward (fwd), the backward alone (bwd) or both (train).

fwd: fn(x, weight, bias) on inputs that do not require grad (the inference path).
bwd: the forward runs once, outside the timed region, on inputs that require grad; the timed call is
     torch.autograd.grad(y, inputs, dy, retain_graph=True), so each trial runs the same backward graph.
train: forward and backward in the timed call, torch.autograd.grad(fn(x, weight, bias), inputs, dy).
The bytes each mode must move at least are BenchCase.minimal_bytes(mode).
"""
import torch

MODES = ("fwd", "bwd", "train")
TITLES = {"fwd": "forward", "bwd": "backward", "train": "forward + backward"}


def needs_grad(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    return mode != "fwd"


def grad_inputs(x, weight, bias) -> list:
    """The tensors gradients are taken of: x and the parameters the case has."""
    return [t for t in (x, weight, bias) if t is not None]


def timed_call(mode: str, fn, x, weight, bias, dy=None):
    """The zero-argument callable a trial times. For bwd this runs fn's forward once now."""
    if not needs_grad(mode):
        return lambda: fn(x, weight, bias)
    inputs = grad_inputs(x, weight, bias)
    if mode == "train":
        return lambda: torch.autograd.grad(fn(x, weight, bias), inputs, dy)
    y = fn(x, weight, bias)
    return lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)
