"""A Llama-shaped decoder for measuring (built under FakeTensorMode by `trainplan.measure_model`: no real memory)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    """One decoder block: RMSNorm, attention (q, k, v, o projections, SDPA), RMSNorm, a SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.norm1 = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.RMSNorm(hidden)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # q, k and v are interleaved by head, and gate and up by unit, so that tensor parallelism's even split of the
        # projections' outputs (tests/scripts/memory_world.py) gives each rank whole heads and matching units; the
        # shapes are read from the tensors, a rank's shard of the heads included.
        batch, sequence, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, sequence, -1, 3, self.head_dim).transpose(1, 2).unbind(3)
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, sequence, -1))
        gate, up = self.gate_up(self.norm2(x)).view(batch, sequence, -1, 2).unbind(-1)
        result: torch.Tensor = x + self.down(functional.silu(gate) * up)
        return result


class Decoder(nn.Module):
    def __init__(
        self, *, vocab: int, hidden: int, layers: int, heads: int, ffn: int, checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.checkpointing = checkpointing
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointing else layer(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def llama_7b() -> Decoder:
    return Decoder(vocab=32000, hidden=4096, layers=32, heads=32, ffn=11008)


def small(checkpointing: bool = False) -> Decoder:
    """A 21M-parameter decoder for measuring real worlds on CPU."""
    return Decoder(vocab=8000, hidden=512, layers=4, heads=8, ffn=1376, checkpointing=checkpointing)
