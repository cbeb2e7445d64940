"""The Anthropic request schema accepts every field the official SDK's request types document
(issue 21 item 2), so a newer SDK's field (as `caller` and `toolset_name` on `tool_use`) fails
here, not in a user's tool loop, and still refuses a field nobody documents.

The SDK's `*_param.py` TypedDicts are walked: for each content block type (`ContentBlockParam`,
and inside them a tool_result's content, a call's `caller`, …) and each tool definition, sample
values are built with every key present (each union member and `None` for each optional value
at least once), then validated as the server validates a request body."""

from __future__ import annotations

import collections.abc
import json
import os
import types
import typing
from typing import Any

import pytest
import typing_extensions as te
from anthropic.types import ContentBlockParam, ToolParam
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

from sluice.api.anthropic.convert import parse_body
from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest
from sluice.api.anthropic.tools import tool_specs
from sluice.api.errors import ApiError
from sluice.serving.errors import ServingError

HEADER_ONLY = {"user_profile_id", "workspace_id"}  # the SDK sends these as headers (reference §2)
_SCALARS: dict[Any, Any] = {str: "x", int: 1, float: 0.5, bool: True, object: "x", Any: "x", type(None): None}


def samples(tp: Any, depth: int = 0) -> list[Any]:
    """Values of type `tp` that together use every key, union member and literal at least once."""
    assert depth < 40, f"type nested too deep: {tp}"
    origin, args = te.get_origin(tp), te.get_args(tp)
    if te.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        per_key = {k: samples(v, depth + 1) for k, v in hints.items()}
        assert all(per_key.values()), f"{tp.__name__}: a key with no sample"
        n = max(len(v) for v in per_key.values())
        return [{k: v[i % len(v)] for k, v in per_key.items()} for i in range(n)]
    if origin in (te.Required, te.NotRequired, te.Annotated):
        return samples(args[0], depth)
    if origin in (typing.Union, types.UnionType):
        return [s for a in args for s in samples(a, depth + 1)]
    if origin is te.Literal:
        return list(args)
    if origin in (dict, collections.abc.Mapping):
        return [{"k": "v"}]
    if (
        origin in (list, collections.abc.Iterable, collections.abc.Sequence)
        or getattr(origin, "__name__", "") == "SequenceNotStr"
    ):
        return [[s] for s in samples(args[0], depth + 1)]
    if tp in _SCALARS:
        return [_SCALARS[tp]]
    if origin is typing.IO or tp is os.PathLike or origin is os.PathLike:
        return []  # a file the SDK reads and sends as base64 text (its union has `str` too)
    raise AssertionError(f"no sample for {tp!r}: teach samples() this type")


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def _parse(body: dict[str, Any]) -> MessagesRequest:
    return parse_body(json.dumps(body).encode(), MessagesRequest, lenient=False)


BLOCKS = samples(ContentBlockParam)


def test_the_walk_covers_every_block_type_and_the_new_tool_use_fields():
    kinds = {b["type"] for b in BLOCKS}
    assert len(kinds) == len(te.get_args(ContentBlockParam)) >= 16
    tool_use = [b for b in BLOCKS if b["type"] == "tool_use"]
    assert {"caller", "toolset_name"} <= set(tool_use[0])
    assert {b["caller"]["type"] for b in tool_use if b["caller"]} >= {"direct", "code_execution_20250825"}


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b["type"])
def test_every_documented_block_field_is_accepted(block):
    for role in ("user", "assistant"):
        _parse(_body(messages=[{"role": role, "content": [block]}]))


@pytest.mark.parametrize("block", BLOCKS[:: max(1, len(BLOCKS) // 40)], ids=lambda b: b["type"])
def test_an_undocumented_block_field_is_still_refused(block):
    with pytest.raises(ApiError, match=r"messages\.0\.content\.0\.not_a_field: Extra inputs are not permitted"):
        _parse(_body(messages=[{"role": "user", "content": [{**block, "not_a_field": 1}]}]))


@pytest.mark.parametrize("tool", samples(ToolParam))
def test_every_documented_tool_field_is_accepted(tool):
    tool = {**tool, "name": "t", "input_schema": {"type": "object", "properties": {}}}
    (spec,) = tool_specs(_parse(_body(tools=[tool])).tools)
    assert spec.name == "t"
    with pytest.raises(ServingError, match=r"tools\.0\.not_a_field: Extra inputs are not permitted"):
        tool_specs(_parse(_body(tools=[{**tool, "not_a_field": 1}])).tools)


@pytest.mark.parametrize(
    "params, model",
    [(MessageCreateParamsNonStreaming, MessagesRequest), (MessageCountTokensParams, CountTokensRequest)],
)
def test_every_documented_top_level_field_is_a_field(params, model):
    missing = set(typing.get_type_hints(params)) - set(model.model_fields) - HEADER_ONLY
    assert not missing, f"{model.__name__} lacks {sorted(missing)}"
