"""The drafter's element-wise kernels: RMSNorm, rotary embeddings (neox and GPT-J layouts), SiLU-and-multiply.

Each is plain torch; on CUDA each runs compiled, one fused kernel each way instead of a pass over memory
per op. CPU runs them eager, so CPU training needs no C++ compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class CudaCompiled:
    """`torch.compile(fn, **options)`, made on the first call: only CUDA paths call it.

    Compiled at import, every process that imports the drafter paid about 2 CPU-seconds of dynamo and inductor
    imports (a CPU train or export stage is mostly its imports) for kernels only a GPU runs.
    """

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        self.fn, self.options = fn, options
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            # One compiled norm serves every RMSNorm: fp32 and bf16 inputs, with and without grad (training and
            # validation), size-1 batches. Each is a dynamo variant of the same code; at the default limit (8)
            # the later ones silently ran eager and most of a GPU run's first epoch went to recompiling. The
            # limit is dynamo's, process-wide; raising it only lets already-needed variants compile.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self._compiled = torch.compile(self.fn, **self.options)
        return self._compiled(*args, **kwargs)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * x32.to(x.dtype)
    return out if out_dtype is None else out.to(out_dtype)


# Element-wise chains fused into one kernel each way on CUDA (eager, each op is a pass over memory).
_rms_norm_fused = CudaCompiled(rms_norm, dynamic=True)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under autocast the norm's result leaves in the compute dtype. A norm feeds matmuls, and autocast
        # would cast an fp32 result once per consumer (q, k and v: three copies of a [T, 2H] tensor each
        # unroll step), and keep the fp32 copy for backward; the residual it feeds is then bf16, as in the
        # engine. At Kimi-K2.5's drafter shape: 3.5% of a step, 7 GiB (docs/benchmarks.md). Off autocast: unchanged.
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        return (_rms_norm_fused if x.is_cuda else rms_norm)(x, self.weight, self.eps, out_dtype)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the default (unscaled) rotary embedding: neox layout (HF rotate_half == vLLM neox), or
    with `interleaved` the GPT-J layout (frequency i on dims 2i, 2i+1: vLLM `is_neox_style=False`, MLA)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # shape: [T, hd/2]
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat([freqs, freqs], dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x shape: [B, heads, T, hd]; cos/sin shape: [T, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)  # in x's dtype, as HF and vLLM do


_apply_rope_fused = CudaCompiled(_apply_rope, dynamic=True)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (_apply_rope_fused if x.is_cuda else _apply_rope)(x, cos, sin)


def _apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # GPT-J layout: (x[2i], x[2i+1]) rotated by frequency i; cos/sin from rope_tables(interleaved=True)
    rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


_apply_rope_interleaved_fused = CudaCompiled(_apply_rope_interleaved, dynamic=True)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (_apply_rope_interleaved_fused if x.is_cuda else _apply_rope_interleaved)(x, cos, sin)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


_silu_mul_fused = CudaCompiled(_silu_mul, dynamic=True)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: the MLP's gated activation."""
    return (_silu_mul_fused if gate.is_cuda else _silu_mul)(gate, up)
