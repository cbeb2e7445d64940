"""A PEFT LoRA adapter's `adapter_config.json`: what sluice serves of it, and a clear refusal of
what it does not.

Served: `r`, `lora_alpha`, `use_rslora` (scale alpha/sqrt(r) instead of alpha/r), `rank_pattern`
and `alpha_pattern` (per-module rank and alpha, keys matched as PEFT matches them), and any
subset of the decoder's seven linears as targets. Refused, naming the field: another PEFT
method, DoRA, trained biases, `modules_to_save` (whole copies of embeddings or heads), and the
newer variants whose forward is not `W x + (alpha/r) B A x` (aLoRA, QALoRA, Conv1D fan-in).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import AdapterError

# The decoder linears an adapter may target, by PEFT's (= the HF module's) name.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Fields whose non-default value changes the forward beyond plain LoRA: (field, why).
_REFUSED = (
    ("use_dora", "DoRA (weight-decomposed LoRA) is not served"),
    ("modules_to_save", "modules_to_save (full copies of other modules) is not served"),
    ("lora_bias", "trained LoRA biases are not served"),
    ("fan_in_fan_out", "fan_in_fan_out (Conv1D layers) does not apply to Llama-family linears"),
    ("use_qalora", "QA-LoRA is not served"),
    ("alora_invocation_tokens", "activated LoRA (aLoRA) is not served"),
    ("trainable_token_indices", "trainable token indices are not served"),
    ("target_parameters", "target_parameters (LoRA on raw parameters) is not served"),
    ("layer_replication", "layer_replication is not served"),
    ("use_bdlora", "block-diagonal LoRA is not served"),
)


@dataclass(slots=True, frozen=True)
class LoraConfig:
    r: int
    alpha: float
    rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    def rank_of(self, module: str) -> int:
        """The rank PEFT gives `module` (its full name: model.layers.3.self_attn.q_proj)."""
        return int(_pattern_value(self.rank_pattern, module, self.r))

    def scale_of(self, module: str) -> float:
        """alpha / r (or alpha / sqrt(r) with rsLoRA), with the module's own rank and alpha."""
        r = self.rank_of(module)
        alpha = float(_pattern_value(self.alpha_pattern, module, self.alpha))
        return alpha / math.sqrt(r) if self.rslora else alpha / r


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    # PEFT's rule (tuners_utils): the first key k with re.match(rf"(.*\.)?{k}$", name)
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?{key}$", module):
            return value
    return default


def parse_adapter_config(text: str, where: str = "adapter_config.json") -> LoraConfig:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdapterError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{where}: expected a JSON object")
    peft_type = raw.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise AdapterError(f"{where}: peft_type is {peft_type!r}; sluice serves LoRA adapters only")
    for key, why in _REFUSED:
        if raw.get(key):
            raise AdapterError(f"{where}: {why} ({key} = {json.dumps(raw[key])})")
    if raw.get("bias", "none") != "none":
        raise AdapterError(f'{where}: bias = {raw["bias"]!r}: trained biases are not served (use bias = "none")')
    r, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"{where}: r must be a positive integer, got {json.dumps(r)}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"{where}: lora_alpha must be a number, got {json.dumps(alpha)}")
    ranks, alphas = raw.get("rank_pattern") or {}, raw.get("alpha_pattern") or {}
    if not isinstance(ranks, dict) or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in ranks.values()
    ):
        raise AdapterError(f"{where}: rank_pattern must map module patterns to positive integers")
    if not isinstance(alphas, dict) or any(
        not isinstance(v, (int, float)) or isinstance(v, bool) for v in alphas.values()
    ):
        raise AdapterError(f"{where}: alpha_pattern must map module patterns to numbers")
    _check_targets(raw.get("target_modules"), where)
    return LoraConfig(r, float(alpha), bool(raw.get("use_rslora", False)), dict(ranks), dict(alphas))


def _check_targets(targets: Any, where: str) -> None:
    """A list of names must name decoder linears; a regex string is checked against the weights
    themselves (adapter_folder.py refuses a tensor of any other module)."""
    if targets is None or isinstance(targets, str):
        return
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"{where}: target_modules must be a list of module names or a regex string")
    bad = [t for t in targets if t.rsplit(".", 1)[-1] not in TARGETS]
    if bad:
        raise AdapterError(
            f"{where}: target module {bad[0]!r} is not a linear of this base model "
            f"(LoRA is served on {', '.join(TARGETS)})"
        )
