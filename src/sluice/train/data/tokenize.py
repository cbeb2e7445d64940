"""An example → token ids and a loss mask, through the model's own tokenizer and chat template.

Chat: the conversation is rendered once with the template; each assistant turn's characters are
found by rendering the conversation up to that turn (the prefix the model sees, generation
prompt included) and up to its end, and the tokens whose text starts inside that span carry the
loss — the reply and the template's end-of-turn marker, so the model learns to stop. Offsets come
from the tokenizer on the whole text, so tokens are exactly those the model sees at serving time.
A template whose renderings are not prefixes of each other (one that rewrites earlier turns)
cannot be masked this way and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.models.tokenizer import Tokenizer
from sluice.train.data.records import ChatExample, Example, TextExample


@dataclass(frozen=True, slots=True)
class Tokenized:
    ids: list[int]
    mask: list[bool]  # True: the model is trained to predict this token


def _encode_with_offsets(tok: Tokenizer, text: str) -> tuple[list[int], list[int]]:
    enc = tok.backend.encode(text, add_special_tokens=False)
    ids, starts = list(enc.ids), [s for s, _ in enc.offsets]
    if tok.add_bos and tok.bos_token is not None:  # as Tokenizer.encode does
        bos = tok.backend.token_to_id(tok.bos_token)
        if bos is not None and (not ids or ids[0] != bos):
            ids, starts = [bos, *ids], [-1, *starts]
    return ids, starts


def _eos_id(tok: Tokenizer) -> int | None:
    return tok.eos_token_ids[0] if tok.eos_token_ids else None


def tokenize_example(tok: Tokenizer, example: Example) -> Tokenized:
    if isinstance(example, TextExample):
        ids = tok.encode(example.text)
        eos = _eos_id(tok)
        if eos is not None:
            ids.append(eos)  # documents end, so packed neighbours are told apart
        return Tokenized(ids, [True] * len(ids))
    return _tokenize_chat(tok, example)


def _tokenize_chat(tok: Tokenizer, example: ChatExample) -> Tokenized:
    msgs = list(example.messages)
    full = tok.render_chat(msgs, add_generation_prompt=False)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = tok.render_chat(msgs[:i], add_generation_prompt=True) if i else ""
        through = tok.render_chat(msgs[: i + 1], add_generation_prompt=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise ValueError(
                "the chat template does not render turns as prefixes of the conversation; "
                "assistant tokens cannot be masked"
            )
        spans.append((len(before), len(through)))
    ids, starts = _encode_with_offsets(tok, full)
    mask = [any(a <= s < b for a, b in spans) for s in starts]
    return Tokenized(ids, mask)
