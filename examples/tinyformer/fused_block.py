"""A module-level candidate for one TinyFormer ``Block``: the whole block in one C++ function.

KernelBench's ``ModelNew`` contract: built with the Block's constructor arguments, parameters
named as the Block's (so the captured or live weights load by name), same forward. The forward
is one C++ call (``torch.utils.cpp_extension.load_inline``) running the block's operators in
eager's order (so dropout draws the same masks from the same RNG state, and autograd records
every step: it trains), with one fusion: causal attention as masked_fill + softmax instead of
``scaled_dot_product_attention``'s math path, which also checks for fully masked rows (a causal
mask has none). Validate it with::

    modulelens capture-module examples/tinyformer/train.py --module blocks.1 --backward -- --steps 1
    modulelens validate-kernel --source examples/tinyformer/fused_block.py --target blocks.1 --claims-training
"""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <torch/csrc/utils/pybind.h>
#include <cmath>

at::Tensor block_forward(const at::Tensor& x, const at::Tensor& ln1_w, const at::Tensor& ln1_b,
                         const at::Tensor& qkv_w, const at::Tensor& qkv_b, const at::Tensor& proj_w,
                         const at::Tensor& proj_b, const at::Tensor& ln2_w, const at::Tensor& ln2_b,
                         const at::Tensor& fc1_w, const at::Tensor& fc1_b, const at::Tensor& fc2_w,
                         const at::Tensor& fc2_b, int64_t n_heads, double eps, double p, bool training) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_heads;
  at::Tensor h = at::layer_norm(x, {C}, ln1_w, ln1_b, eps);
  std::vector<at::Tensor> qkv = at::linear(h, qkv_w, qkv_b).split(C, -1);
  const double s = std::sqrt(1.0 / std::sqrt(static_cast<double>(D)));  // both sides scaled, as SDPA's math path
  at::Tensor q = qkv[0].view({B, T, n_heads, D}).transpose(1, 2).mul(s);
  at::Tensor k = qkv[1].view({B, T, n_heads, D}).transpose(1, 2).mul(s);
  at::Tensor v = qkv[2].view({B, T, n_heads, D}).transpose(1, 2);
  at::Tensor future = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
  at::Tensor att = at::softmax(at::matmul(q, k.transpose(-2, -1)).masked_fill(future, -INFINITY), -1);
  if (training && p > 0) att = at::dropout(att, p, true);
  at::Tensor y = at::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  at::Tensor x1 = x.add(at::dropout(at::linear(y, proj_w, proj_b), p, training));
  h = at::layer_norm(x1, {C}, ln2_w, ln2_b, eps);
  h = at::linear(at::gelu(at::linear(h, fc1_w, fc1_b)), fc2_w, fc2_b);
  return x1.add(at::dropout(h, p, training));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("block_forward", &block_forward); }
"""

_ext = load_inline(name="tinyformer_fused_block_v1", cpp_sources=[CPP], extra_cflags=["-O2"],
                   no_implicit_headers=True, verbose=False)


class _Attention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)


class _MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)


class ModelNew(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        if getattr(cfg.activation, "value", cfg.activation) != "gelu":
            raise NotImplementedError("this fused block implements the GELU activation only")
        if cfg.dim % cfg.n_heads:
            raise ValueError("dim must be divisible by n_heads")
        self.n_heads, self.eps, self.p = cfg.n_heads, float(cfg.norm_eps), float(cfg.dropout)
        self.ln1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = _Attention(cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = _MLP(cfg.dim, cfg.mlp_ratio * cfg.dim)
        assert math.isfinite(self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, m = self.attn, self.mlp
        return _ext.block_forward(x, self.ln1.weight, self.ln1.bias, a.qkv.weight, a.qkv.bias, a.proj.weight,
                                  a.proj.bias, self.ln2.weight, self.ln2.bias, m.fc1.weight, m.fc1.bias,
                                  m.fc2.weight, m.fc2.bias, self.n_heads, self.eps, self.p, self.training)
