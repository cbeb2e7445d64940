"""One Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) over a flat, paged batch.

Weights arrive as a Hugging Face-named state dict from any loader; q/k/v and gate/up are fused
into one matmul each at construction, which is where the CPU spends its time. The model is pure
tensor code: it never decides which tokens run (the scheduler does) nor samples (the sampler does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sluice.errors import ModelLoadError
from sluice.models.attention import AttentionBackend, AttentionMetadata, TorchPagedAttention
from sluice.models.config import ModelConfig
from sluice.models.linear import Linear
from sluice.models.rope import RotaryTable


class _Weights:
    """Pops HF-named tensors off a state dict, moving each to the target device."""

    def __init__(self, state: dict[str, torch.Tensor], device: torch.device):
        self.state = dict(state)
        self.device = device

    def take(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise ModelLoadError(f"weight {key!r} is missing from the checkpoint")
        return self.state.pop(key).to(self.device)

    def maybe(self, key: str) -> torch.Tensor | None:
        return self.take(key) if key in self.state else None


class _Layer:
    __slots__ = ("input_norm", "post_norm", "qkv", "o", "gate_up", "down")

    def __init__(self, w: _Weights, prefix: str, bias: bool):
        a = prefix + "self_attn."
        self.input_norm = w.take(prefix + "input_layernorm.weight")
        self.post_norm = w.take(prefix + "post_attention_layernorm.weight")
        qkv_w = torch.cat([w.take(a + "q_proj.weight"), w.take(a + "k_proj.weight"), w.take(a + "v_proj.weight")])
        qkv_b = torch.cat([w.take(a + f"{p}_proj.bias") for p in "qkv"]) if bias else None
        self.qkv = Linear(qkv_w, qkv_b)
        self.o = Linear(w.take(a + "o_proj.weight"))
        m = prefix + "mlp."
        self.gate_up = Linear(torch.cat([w.take(m + "gate_proj.weight"), w.take(m + "up_proj.weight")]))
        self.down = Linear(w.take(m + "down_proj.weight"))


class LlamaModel:
    """Forward pass: token ids + positions + attention metadata → logits at selected rows."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        device: torch.device | str = "cpu",
        attention: AttentionBackend | None = None,
    ):
        config.validate()
        self.config = config
        self.device = torch.device(device)
        w = _Weights(weights, self.device)
        self.embed = w.take("model.embed_tokens.weight")
        self.dtype = self.embed.dtype
        self.layers = [_Layer(w, f"model.layers.{i}.", config.attention_bias) for i in range(config.num_layers)]
        self.norm = w.take("model.norm.weight")
        head = w.maybe("lm_head.weight")
        self.lm_head = Linear(self.embed if (config.tie_word_embeddings or head is None) else head)
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.inter = config.intermediate_size
        rope = RotaryTable(config.head_dim, config.max_position, config.rope_theta, config.rope_scaling)
        self.rope_cos = rope.cos.to(self.device, self.dtype)
        self.rope_sin = rope.sin.to(self.device, self.dtype)
        self.rotate = rope.apply
        self.attention = attention or TorchPagedAttention(config.num_heads, config.num_kv_heads, config.head_dim)

    def _rms_norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # Same op order as transformers' LlamaRMSNorm: statistics in fp32, then scale in the
        # model dtype (the casts are no-ops for fp32 weights).
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        return w * (xf * torch.rsqrt(variance + self.config.rms_norm_eps)).to(x.dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,  # [N] rows whose next-token logits are needed
    ) -> torch.Tensor:  # [N, vocab] fp32
        cfg = self.config
        T = input_ids.shape[0]
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        h = F.embedding(input_ids, self.embed)
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_sin[positions].unsqueeze(1)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            qkv = layer.qkv(self._rms_norm(h, layer.input_norm))
            q = self.rotate(qkv[:, :q_end].view(T, cfg.num_heads, cfg.head_dim), cos, sin)
            k = self.rotate(qkv[:, q_end:k_end].view(T, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = qkv[:, k_end:].view(T, cfg.num_kv_heads, cfg.head_dim)
            attn = self.attention.forward(q, k, v, k_cache, v_cache, meta)
            h = h + layer.o(attn.reshape(T, self.q_size))
            gate_up = layer.gate_up(self._rms_norm(h, layer.post_norm))
            h = h + layer.down(F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :])
        h = self._rms_norm(h[logits_indices], self.norm)
        return self.lm_head(h).float()
