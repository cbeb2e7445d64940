"""transformers as the correctness reference, and the tie rule for comparing greedy outputs.

Two correct fp32 implementations may still pick different tokens where the two best logits are
within rounding of each other. The rule (from the issue): a differing token is accepted only if
transformers' own top-2 logits at that position are within TIE_TOL and our token is one of them;
after an accepted tie the continuations legitimately differ, so comparison stops there, and the
test reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TIE_TOL = 1e-4


@dataclass
class Reference:
    tokens: list[int]
    logits: list[torch.Tensor]  # raw next-token logits at each generated position


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | list[int] | None = None) -> Reference:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=eos,
            pad_token_id=eos if isinstance(eos, int) else None,
        )
    tokens = out.sequences[0][len(prompt) :].tolist()
    return Reference(tokens, [lg[0].float() for lg in out.logits])


def compare(ref: Reference, got: list[int], label: str, tol: float = TIE_TOL) -> str | None:
    """None if equal; a note if they differ only after a tie; raises AssertionError otherwise.
    `tol`: the top-2 gap under which a position counts as a tie (wider for half precision)."""
    for i, (a, b) in enumerate(zip(ref.tokens, got)):
        if a == b:
            continue
        top = torch.topk(ref.logits[i], 2)
        gap = float(top.values[0] - top.values[1])
        assert gap < tol and b in top.indices.tolist(), (
            f"{label}: token {i} differs (reference {a}, sluice {b}) and it is not a tie: "
            f"top-2 logit gap {gap:.3g} >= {tol:.3g}"
        )
        return f"{label}: accepted a tie at token {i} (top-2 gap {gap:.2g}); compared {i} tokens"
    assert len(ref.tokens) == len(got), f"{label}: lengths differ: reference {len(ref.tokens)}, sluice {len(got)}"
    return None
