"""`POST /tokenize` and `POST /detokenize` (vLLM's and llama.cpp's helpers), with the tokenizer of
the model's main version: clients count and slice prompts in the server's own tokens."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError

from sluice.api import openapi_doc as doc
from sluice.api.anthropic.convert import describe_validation_error
from sluice.api.auth import require_principal
from sluice.api.errors import bad_request
from sluice.api.json_body import json_object
from sluice.api.openai.convert import to_conversation
from sluice.api.openai.logprobs import token_text
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.api.openai.tokenize_schema import DetokenizeRequest, TokenizeRequest
from sluice.serving.guided import resolve_tool_format
from sluice.serving.pipeline import ServingPipeline
from sluice.serving.prompt import build_prompt
from sluice.serving.runtime import ServingRuntime


def _parse(model: type[BaseModel], raw: bytes | dict[str, Any]) -> Any:
    try:
        data = raw if isinstance(raw, dict) else json_object(raw, "We could not parse the JSON body of your request")
        return model.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(exc)
        raise bad_request(message, param=message.split(":", 1)[0]) from None


def build_router(rt: ServingRuntime, pipeline: ServingPipeline) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/tokenize",
        openapi_extra=doc.operation(doc.Family.OPENAI, body="TokenizeRequest", ok="TokenizeResult", errors=doc.LOOKUP),
    )
    async def tokenize(request: Request) -> Any:
        await require_principal(request, rt.authenticator)
        body: TokenizeRequest = _parse(TokenizeRequest, await request.body())
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("exactly one of prompt or messages must be given", param="prompt")
        tokenizer, window = pipeline.tokenizer_of(body.model)
        if body.prompt is not None:
            ids = await asyncio.to_thread(tokenizer.encode, body.prompt)
        else:
            chat = _parse(ChatCompletionRequest, {"model": body.model, "messages": body.messages})
            fmt = resolve_tool_format(rt.settings.tool_format)
            conversation = to_conversation(chat)
            if body.add_generation_prompt:
                ids = (await asyncio.to_thread(build_prompt, conversation, tokenizer, fmt)).token_ids
            else:
                messages = [
                    {"role": t.role.value, "content": "\n\n".join(str(p) for p in t.parts)} for t in conversation.turns
                ]
                ids = await asyncio.to_thread(tokenizer.encode_chat, messages, False)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": window, "tokens": ids, "token_strs": None}
        if body.return_token_strs:
            texts = token_text(tokenizer)
            out["token_strs"] = [texts.text(t) for t in ids]
        return out

    @router.post(
        "/detokenize",
        openapi_extra=doc.operation(
            doc.Family.OPENAI, body="DetokenizeRequest", ok="DetokenizeResult", errors=doc.LOOKUP
        ),
    )
    async def detokenize(request: Request) -> Any:
        await require_principal(request, rt.authenticator)
        body: DetokenizeRequest = _parse(DetokenizeRequest, await request.body())
        tokenizer, _ = pipeline.tokenizer_of(body.model)
        bad = next((t for t in body.tokens if not 0 <= t < tokenizer.vocab_size), None)
        if bad is not None:
            raise bad_request(
                f"tokens: token id {bad} is outside the vocabulary (size {tokenizer.vocab_size})", param="tokens"
            )
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    return router
