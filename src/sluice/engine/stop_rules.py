"""Whether a reply ends with the token just appended, and why: one place for the stop checks.

The order is the contract every path keeps (plain decode, a speculative decode's verified
tokens one by one, a resumed stream): a stop token id, then EOS (unless the request ignores it),
then a stop string the detokenizer matched, then the grammar (complete: the reply ends at once,
as EOS, so nothing costs another step; a token outside it: an error), then the output budget,
then the context window.
"""

from __future__ import annotations

import logging

from sluice.engine.request import Request
from sluice.models.detokenizer import IncrementalDetokenizer
from sluice.types import FinishReason

log = logging.getLogger("sluice.engine.engine")  # the engine's logger: its records read as before the split


def stop_reason(
    request: Request, token: int, detok: IncrementalDetokenizer, eos_ids: frozenset[int] | set[int], max_model_len: int
) -> tuple[FinishReason | None, str | None]:
    """(why the reply ends, an error message for ERROR) after `token` was appended to
    `request.all_token_ids`; (None, None) while it goes on. Feeds the detokenizer the token
    unless it is a stop token or EOS (their text is never shown)."""
    sampling = request.sampling
    if token in sampling.stop_token_ids:
        return FinishReason.STOP_SEQUENCE, None
    if token in eos_ids and not sampling.ignore_eos:
        return FinishReason.EOS, None
    detok.add_token(token)
    if detok.stop_matched is not None:
        return FinishReason.STOP_SEQUENCE, None
    if request.grammar is not None:
        reason, error = _advance_grammar(request, token)
        if reason is not None:
            return reason, error
    if request.num_output_tokens >= sampling.max_tokens:
        return FinishReason.LENGTH, None
    if request.num_tokens >= max_model_len:
        return FinishReason.CONTEXT, None
    return None, None


def _advance_grammar(request: Request, token: int) -> tuple[FinishReason | None, str | None]:
    """Advance the request's grammar by its new token: the reply ends (EOS) the moment the
    grammar is complete, so nothing (not even a forced end-of-sequence) costs a step."""
    grammar = request.grammar
    assert grammar is not None
    if not grammar.accept(token):
        log.error("request %s: sampled token %d is outside its grammar", request.request_id, token)
        return FinishReason.ERROR, f"constrained decoding: {grammar.error or 'token rejected'}"
    return (FinishReason.EOS, None) if grammar.is_stopped else (None, None)
