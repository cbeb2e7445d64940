"""Log-probabilities of chosen tokens, and the most likely alternatives, from raw logits.

The distribution is the model's own: the exact log-softmax (fp32) of the logits as the forward
produced them, before temperature, top-k/p or a grammar mask shape the draw. That is what
evaluation harnesses score with, and what OpenAI documents (the logprob of the sampled token
under the model, not under the sampler). Computed only for rows that ask (one log-softmax per
row); requests that do not ask cost nothing.
"""

from __future__ import annotations

import torch

from sluice.types import TokenLogprob


def log_softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """[N, vocab] logits → [N, vocab] fp32 log-probabilities (a new tensor: masks applied to
    `logits` afterwards, in place, do not reach it)."""
    return torch.log_softmax(logits.float(), dim=-1)


def token_logprobs(logprobs: torch.Tensor, token_ids: list[int], top_n: list[int]) -> list[TokenLogprob]:
    """One TokenLogprob per row of `logprobs` [N, vocab]: of `token_ids[i]`, with the
    `top_n[i]` most likely alternatives. One read back for all rows."""
    if not token_ids:
        return []
    ids = torch.tensor(token_ids, device=logprobs.device).view(-1, 1)
    chosen = logprobs.gather(1, ids).view(-1).tolist()
    k = max(top_n)
    top_values: list[list[float]] = []
    top_ids: list[list[int]] = []
    if k > 0:
        values, indices = logprobs.topk(k, dim=-1)  # sorted, most likely first
        top_values, top_ids = values.tolist(), indices.tolist()
    return [
        TokenLogprob(t, lp, tuple(zip(top_ids[i][: top_n[i]], top_values[i][: top_n[i]])) if top_n[i] else ())
        for i, (t, lp) in enumerate(zip(token_ids, chosen))
    ]
