"""One Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) over a flat, paged batch.

Weights arrive as a Hugging Face-named dict from any loader, as fp32 tensors or still in their
GGUF blocks (`QuantizedWeight`, when the CPU kernels run); q/k/v and gate/up are fused into one
matmul each at construction, which is where the CPU spends its time. The model is pure tensor
code: it never decides which tokens run (the scheduler does) nor samples (the sampler does).

Two forwards compute the same function: the portable torch one below (any device, any dtype;
on CUDA with models/sdpa_attention.py for the decodes) and the CPU kernel one
(models/kernels/fused_forward.py: fused RMSNorm + residual, RoPE + cache write, SiLU·mul, paged
decode attention, quantized linears), chosen at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from sluice.errors import ModelLoadError
from sluice.models.attention import AttentionBackend, AttentionMetadata, TorchPagedAttention
from sluice.models.config import ModelConfig
from sluice.models.kernels import Numerics
from sluice.models.linear import Linear, make_linear
from sluice.models.lora.batch import LoraBatch
from sluice.models.lora.weights import Module
from sluice.models.quantized import QuantizedWeight, QuantType, Weight, as_tensor
from sluice.models.rope import RotaryTable

if TYPE_CHECKING:
    from sluice.models.kernels.packed_linear import PackedLinear

# builds a layer's linear from its weight and bias (models/linear.py's make_linear on one device)
_MakeLinear = Callable[[Weight, "torch.Tensor | None"], "Linear | PackedLinear"]


class _Weights:
    """Pops HF-named weights off a state dict, moving tensors to the target device."""

    def __init__(self, state: Mapping[str, Weight], device: torch.device):
        self.state = dict(state)
        self.device = device

    def take(self, key: str) -> Weight:
        if key not in self.state:
            raise ModelLoadError(f"weight {key!r} is missing from the checkpoint")
        w = self.state.pop(key)
        return w if isinstance(w, QuantizedWeight) else w.to(self.device)

    def tensor(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        return as_tensor(self.take(key), dtype).to(self.device)

    def maybe(self, key: str) -> Weight | None:
        return self.take(key) if key in self.state else None


def _fuse(parts: list[Weight], dtype: torch.dtype) -> Weight:
    """Row-concatenate weights: in their blocks when they share a type, else as tensors."""
    quantized = [p for p in parts if isinstance(p, QuantizedWeight)]
    if len(quantized) == len(parts) and len({p.qtype for p in quantized}) == 1:
        return QuantizedWeight.concat(quantized)
    return torch.cat([as_tensor(p, dtype) for p in parts])


class _Layer:
    __slots__ = ("input_norm", "post_norm", "qkv", "o", "gate_up", "down")

    def __init__(self, w: _Weights, prefix: str, bias: bool, linear: _MakeLinear, dtype: torch.dtype):
        a = prefix + "self_attn."
        self.input_norm = w.tensor(prefix + "input_layernorm.weight", dtype)
        self.post_norm = w.tensor(prefix + "post_attention_layernorm.weight", dtype)
        qkv_w = _fuse([w.take(a + "q_proj.weight"), w.take(a + "k_proj.weight"), w.take(a + "v_proj.weight")], dtype)
        qkv_b = torch.cat([w.tensor(a + f"{p}_proj.bias", dtype) for p in "qkv"]) if bias else None
        self.qkv = linear(qkv_w, qkv_b)
        self.o = linear(w.take(a + "o_proj.weight"), None)
        m = prefix + "mlp."
        self.gate_up = linear(_fuse([w.take(m + "gate_proj.weight"), w.take(m + "up_proj.weight")], dtype), None)
        self.down = linear(w.take(m + "down_proj.weight"), None)


class LlamaModel:
    """Forward pass: token ids + positions + attention metadata → logits at selected rows."""

    def __init__(
        self,
        config: ModelConfig,
        weights: Mapping[str, Weight],
        device: torch.device | str = "cpu",
        attention: AttentionBackend | None = None,
        ops: ModuleType | None = None,
    ):
        config.validate()
        self.config = config
        self.device = torch.device(device)
        embed_w = weights.get("model.embed_tokens.weight")
        if embed_w is None:
            raise ModelLoadError("weight 'model.embed_tokens.weight' is missing from the checkpoint")
        self.dtype = torch.float32 if isinstance(embed_w, QuantizedWeight) else embed_w.dtype
        # the kernels run fp32 on CPU; anything else takes the torch path
        usable = self.device.type == "cpu" and self.dtype == torch.float32
        usable = usable and config.num_heads // config.num_kv_heads <= 16  # the attention kernel's limit
        self.ops = ops if ops is not None and usable and ops.supports_head_dim(config.head_dim) else None
        w = _Weights(weights, self.device)

        def linear(weight: Weight, bias: torch.Tensor | None) -> Linear | PackedLinear:
            return make_linear(weight, bias, self.ops, self.device, self.dtype)

        embed = w.take("model.embed_tokens.weight")
        self.layers = [
            _Layer(w, f"model.layers.{i}.", config.attention_bias, linear, self.dtype) for i in range(config.num_layers)
        ]
        self.norm = w.tensor("model.norm.weight", self.dtype)
        head = w.maybe("lm_head.weight")
        self._set_embedding_and_head(embed, None if config.tie_word_embeddings else head, linear)
        if self.ops is not None:  # the kernel path's packed weights, on huge pages where the OS allows
            from sluice.models.kernels.packed_linear import PackedLinear
            from sluice.models.kernels.weight_region import gather_on_huge_pages

            gather_on_huge_pages(lin for lin in self.linears() if isinstance(lin, PackedLinear))
            if isinstance(self.lm_head, PackedLinear):  # the greedy head's bounds now, not on the first request
                self.lm_head.prepare_argmax()
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.inter = config.intermediate_size
        rope = RotaryTable(config.head_dim, config.max_position, config.rope_theta, config.rope_scaling)
        self.rope_cos = rope.cos.to(self.device, self.dtype).contiguous()
        self.rope_sin = rope.sin.to(self.device, self.dtype).contiguous()
        self.rotate = rope.apply
        self.attention = attention if attention is not None else self._default_attention()
        # the kernel path's layers in one extension call per step (models/kernels/fused_forward.py)
        self.stack: Any = None
        if self.ops is not None:
            from sluice.models.kernels.fused_forward import build_decoder_stack

            self.stack = build_decoder_stack(self)

    def _set_embedding_and_head(self, embed: Weight, head: Weight | None, linear: _MakeLinear) -> None:
        """The lookup table and the LM head (`head` None: tied to the table). A tied Q8_0 table
        is packed once and serves both the lookup and the LM head."""
        self.embed_packed: PackedLinear | None = None
        self.embed: torch.Tensor | None = None
        if self.ops is not None and isinstance(embed, QuantizedWeight) and embed.qtype is QuantType.Q8_0:
            from sluice.models.kernels.packed_linear import PackedLinear

            packed = linear(embed, None)
            assert isinstance(packed, PackedLinear), "a Q8_0 weight packs when the kernels run"
            self.embed_packed = packed
        else:
            self.embed = as_tensor(embed, self.dtype).to(self.device)
        self.lm_head: Linear | PackedLinear
        if head is not None:
            self.lm_head = linear(head, None)
        elif self.embed_packed is not None:
            self.lm_head = self.embed_packed
        else:
            assert self.embed is not None
            self.lm_head = linear(self.embed, None)

    def _default_attention(self) -> AttentionBackend:
        """The kernels' paged attention when they run, SDPA's on CUDA, else the portable torch one."""
        cfg = self.config
        if self.ops is not None:
            from sluice.models.kernels.paged_attention import KernelPagedAttention

            return KernelPagedAttention(self.ops, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window)
        if self.device.type == "cuda":
            from sluice.models.sdpa_attention import SdpaPagedAttention

            return SdpaPagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window, self.dtype)
        return TorchPagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.sliding_window)

    @property
    def uses_kernels(self) -> bool:
        return self.ops is not None

    def linears(self) -> list[Any]:
        """The LM head and every layer's linears (PackedLinear on the kernel path)."""
        return [self.lm_head] + [getattr(layer, n) for layer in self.layers for n in ("qkv", "o", "gate_up", "down")]

    def weight_bytes(self) -> int:
        """Memory held by the weights (packed blocks or fp32 tensors), the KV cache excluded."""
        total = sum(lin.nbytes for lin in {id(x): x for x in self.linears()}.values())
        tensors = [self.norm] + [t for layer in self.layers for t in (layer.input_norm, layer.post_norm)]
        if self.embed is not None:  # the torch path's lookup table (its LM head packs a copy)
            tensors.append(self.embed)
        return total + sum(t.numel() * t.element_size() for t in tensors)

    def embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_packed is not None:
            return self.embed_packed.embed(input_ids)
        assert self.embed is not None, "a model without a packed table keeps the table itself"
        return F.embedding(input_ids, self.embed)

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
        numerics: Numerics = Numerics.EXACT,
        argmax_rows: torch.Tensor | None = None,  # [R] int64: rows of the N whose argmax is all that is used
        lora: LoraBatch | None = None,  # each row's adapter (models/lora/batch.py); None: the base alone
    ) -> torch.Tensor:  # [N, vocab] fp32
        """The logits of the `logits_indices` rows. A row listed in `argmax_rows` may come back
        with only the logits its argmax needs (the rest -inf; the kernels' greedy head), so it
        must not be used for anything but its argmax; the torch path returns every row whole.
        With `lora`, every linear's output of a row gains its adapter's low-rank product."""
        self.attention.prepare(meta)
        lora = None if lora is None or lora.is_empty else lora
        if self.ops is not None:
            from sluice.models.kernels.fused_forward import fused_forward

            return fused_forward(
                self,
                input_ids,
                positions,
                meta,
                kv_caches,
                logits_indices,
                numerics is Numerics.FAST,
                argmax_rows,
                lora,
            )
        return self._torch_forward(input_ids, positions, meta, kv_caches, logits_indices, lora)

    def _torch_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        cfg = self.config
        T = input_ids.shape[0]
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        h = self.embed_rows(input_ids)
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_sin[positions].unsqueeze(1)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            x = self._rms_norm(h, layer.input_norm)
            qkv = layer.qkv(x)
            if lora is not None:
                lora.apply(qkv, x, i, Module.QKV)
            q = self.rotate(qkv[:, :q_end].view(T, cfg.num_heads, cfg.head_dim), cos, sin)
            k = self.rotate(qkv[:, q_end:k_end].view(T, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = qkv[:, k_end:].view(T, cfg.num_kv_heads, cfg.head_dim)
            attn = self.attention.forward(q, k, v, k_cache, v_cache, meta).reshape(T, self.q_size)
            o = layer.o(attn)
            if lora is not None:
                lora.apply(o, attn, i, Module.O_PROJ)
            h = h + o
            x = self._rms_norm(h, layer.post_norm)
            gate_up = layer.gate_up(x)
            if lora is not None:
                lora.apply(gate_up, x, i, Module.GATE_UP)
            act = F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :]
            down = layer.down(act)
            if lora is not None:
                lora.apply(down, act, i, Module.DOWN)
            h = h + down
        h = self._rms_norm(h[logits_indices], self.norm)
        return self.lm_head(h).float()
