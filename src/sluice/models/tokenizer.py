"""Tokenizer + chat template: text ⇄ token ids, and chat messages → prompt text.

Backed by Hugging Face `tokenizers` (Rust) for speed; the chat template is the model's own
Jinja template rendered in a sandbox, the way transformers renders it. jinja2 is imported on the
first render: the engine worker receives token ids and never renders, so it does not pay for it
(~9 MiB resident).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tokenizers

from sluice.errors import InvalidRequestError

# Used when a model ships no template: ChatML, which SmolLM2 and Qwen2 use.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise InvalidRequestError(f"chat template: {message}")


@dataclass(slots=True)
class Tokenizer:
    backend: tokenizers.Tokenizer
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    add_bos: bool = False
    _template: Any = None  # the compiled jinja2.Template, on first use

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it (e.g. <|im_start|>) map to their ids."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token is not None:
            bos = self.backend.token_to_id(self.bos_token)
            if bos is not None and (not ids or ids[0] != bos):
                ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Prompt text for `messages` ([{role, content: str}]) through the model's template."""
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self.chat_template or DEFAULT_CHAT_TEMPLATE)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))
