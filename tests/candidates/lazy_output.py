"""Cheat (issue 22, attack 4): returns a torch.Tensor subclass whose values are computed only when something
reads them (__torch_dispatch__), so forward itself costs nothing. Must be cheating naming LazyLayerNorm (the
old evaluator blamed itself: "evaluator error ... invalid python storage")."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_map


class LazyLayerNorm(torch.Tensor):
    @staticmethod
    def __new__(cls, x, shape):
        t = torch.Tensor._make_wrapper_subclass(cls, x.shape, dtype=x.dtype, device=x.device)
        t.source, t.normalized_shape = x, shape
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def compute(a):
            return F.layer_norm(a.source, a.normalized_shape) if isinstance(a, LazyLayerNorm) else a
        return func(*tree_map(compute, args), **tree_map(compute, kwargs or {}))


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)

    def forward(self, x):
        return LazyLayerNorm(x, self.normalized_shape)
