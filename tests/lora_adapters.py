"""LoRA adapters for the tests, made by PEFT itself (get_peft_model + save_pretrained) on a
transformers model, with a non-zero B (PEFT initialises B to zero, which would change nothing),
or drawn directly as tensors for the kernel tests. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

from sluice.models.config import ModelConfig
from sluice.models.lora.adapter_config import TARGETS, LoraConfig
from sluice.models.lora.adapter_folder import AdapterTensors, LoraPair, linear_shape


def random_adapter(
    cfg: ModelConfig,
    rank: int = 8,
    targets: tuple[str, ...] = TARGETS,
    seed: int = 0,
    alpha: float = 16.0,
    std: float = 0.1,
) -> AdapterTensors:
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for layer in range(cfg.num_layers):
        for t in targets:
            out_f, in_f = linear_shape(cfg, t)
            a = torch.randn(rank, in_f, generator=g) * std
            b = torch.randn(out_f, rank, generator=g) * std
            pairs[(layer, t)] = LoraPair(a, b, alpha / rank)
    return AdapterTensors(LoraConfig(rank, alpha), pairs, 0)


def peft_adapter(
    model,
    out: Path,
    rank: int = 8,
    alpha: int = 16,
    seed: int = 0,
    targets: tuple[str, ...] = TARGETS,
    std: float = 0.05,
    **extra,
) -> Path:
    """Wrap `model` (a transformers CausalLM, left unchanged) with a fresh LoRA of `rank`,
    randomise A and B, save the adapter folder to `out`. Returns `out`."""
    import copy

    import peft

    wrapped = peft.get_peft_model(
        copy.deepcopy(model),
        peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, **extra),
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * std)
    wrapped.save_pretrained(str(out))
    return out


def peft_reference(model, adapter_dir: Path):
    """transformers + PEFT with the adapter folder loaded, as PEFT loads it (fp32, eval)."""
    import copy

    import peft

    return peft.PeftModel.from_pretrained(copy.deepcopy(model), str(adapter_dir)).eval()


def peft_multi(model, adapters: dict[str, Path]):
    """One PeftModel holding every adapter (on a copy of `model`): `use(peft, name)` picks one,
    `use(peft, None)` the base model, without a model copy per adapter."""
    import copy

    import peft

    names = list(adapters)
    wrapped = peft.PeftModel.from_pretrained(copy.deepcopy(model), str(adapters[names[0]]), adapter_name=names[0])
    for name in names[1:]:
        wrapped.load_adapter(str(adapters[name]), adapter_name=name)
    return wrapped.eval()


def greedy_with(peft_model, name: str | None, prompt: list[int], max_new_tokens: int, eos):
    """transformers + PEFT's greedy reference (tests/reference.py) with adapter `name`, or the
    base model alone (PEFT's disable_adapter) for None."""
    from tests.reference import hf_greedy

    if name is None:
        with peft_model.disable_adapter():
            return hf_greedy(peft_model, prompt, max_new_tokens, eos=eos)
    peft_model.set_adapter(name)
    return hf_greedy(peft_model, prompt, max_new_tokens, eos=eos)
