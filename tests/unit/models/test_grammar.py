"""Constrained decoding without the model: schema checks, grammar shapes, masks, the spec's
own validation and its trip over gRPC."""

from __future__ import annotations

import json

import pytest
import torch

from sluice.errors import InvalidRequestError
from sluice.models.grammar.bitmask import apply_grammars, unpack, words_for
from sluice.models.grammar.closed_objects import close_objects
from sluice.models.grammar.compiler import GrammarCompiler, check_guided
from sluice.models.grammar.schema_check import UNSUPPORTED, check_schema
from sluice.models.tools.format import HERMES
from sluice.models.tools.guidance import json_schema_guidance, tool_guidance
from sluice.tool_types import ToolChoice, ToolChoiceMode, ToolSpec
from sluice.types import CallSyntax, GenerationRequest, GuidedDecoding, GuidedKind, SamplingParams, ToolGrammar
from sluice.worker.convert import request_from_pb, request_to_pb

WEATHER = ToolSpec(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
    strict=True,
)


@pytest.fixture(scope="module")
def compiler():
    from sluice.models.tokenizer_loader import load_tokenizer

    tok, cfg = load_tokenizer()
    return GrammarCompiler(tok.backend, cfg.vocab_size, list(tok.eos_token_ids)), tok


def _feed(matcher, tok, text: str) -> None:
    for t in tok.encode(text):
        assert matcher.accept(t), f"{text!r} rejected at {tok.decode([t])!r}: {matcher.error}"


def _allowed(matcher, vocab: int) -> list[int]:
    bits = torch.zeros((1, words_for(vocab)), dtype=torch.int32)
    matcher.fill(bits, 0)
    return unpack(bits, vocab)[0].nonzero().flatten().tolist()


# -- schema checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("keyword", sorted(UNSUPPORTED))
def test_every_unsupported_keyword_is_refused_by_name_and_path(keyword):
    schema = {"type": "object", "properties": {"tags": {"type": "array", keyword: {}}}}
    with pytest.raises(InvalidRequestError) as err:
        check_schema(schema, "schema")
    assert f"schema.properties.tags.{keyword}" in str(err.value) and f"'{keyword}'" in str(err.value)


def test_property_names_that_look_like_keywords_are_not_keywords():
    check_schema({"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}}, "schema")


@pytest.mark.parametrize(
    "schema, fragment",
    [
        ({"type": "array", "items": [{"type": "integer"}]}, "prefixItems"),
        ({"type": "number", "maximum": 3, "exclusiveMaximum": True}, "must be a number"),
        ({"$ref": "https://example.com/s.json"}, "only local references"),
        ({"type": "object", "properties": {"a": 3}}, "must be an object or a boolean"),
    ],
)
def test_draft7_and_remote_forms_are_refused(schema, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        check_schema(schema, "schema")


@pytest.mark.parametrize(
    "schema, fragment",
    [
        ({"type": "objekt"}, "objekt"),
        ({"type": "integer", "minimum": 5, "maximum": 3}, "minimum"),
        ({"type": "string", "format": "color"}, "format"),
        ({"$ref": "#/$defs/missing"}, "missing"),
    ],
)
def test_invalid_schemas_are_refused_with_the_library_reason(schema, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        check_guided(json_schema_guidance(schema))


def test_a_strict_tool_with_an_unsupported_schema_is_refused_a_loose_one_falls_back(compiler):
    comp, _ = compiler
    bad = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    strict = tool_guidance([ToolSpec("t", bad, strict=True)], ToolChoice(ToolChoiceMode.ANY), HERMES)
    with pytest.raises(InvalidRequestError, match=r"tools\.t\.input_schema\.properties\.tags\.uniqueItems"):
        comp.validate(strict)
    comp.validate(tool_guidance([ToolSpec("t", bad)], ToolChoice(ToolChoiceMode.ANY), HERMES))


def test_close_objects_narrows_only_silent_objects():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"x": {}}}, "b": {"allOf": [{"properties": {"y": {}}}]}},
        "required": ["a"],
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["b"]["allOf"][0]
    assert "additionalProperties" not in close_objects({"properties": {"a": {}}, "required": ["zz"]})
    assert "additionalProperties" not in schema  # a copy


# -- the spec itself -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, fragment",
    [
        (GuidedDecoding(GuidedKind.JSON_SCHEMA), "needs a schema"),
        (GuidedDecoding(GuidedKind.TOOL_CALLS, tools=(ToolGrammar("a"),)), "call syntax"),
        (GuidedDecoding(GuidedKind.TOOL_CALLS, calls=HERMES.call_syntax()), "no tool"),
        (GuidedDecoding(GuidedKind.TOOL_CALLS, tools=(ToolGrammar("a b"),), calls=HERMES.call_syntax()), "must match"),
        (
            GuidedDecoding(
                GuidedKind.TOOL_CALLS, tools=(ToolGrammar("a"), ToolGrammar("a")), calls=HERMES.call_syntax()
            ),
            "unique",
        ),
        (
            GuidedDecoding(
                GuidedKind.TOOL_CALLS, tools=(ToolGrammar("a"),), calls=HERMES.call_syntax(), min_calls=2, max_calls=1
            ),
            "bounds",
        ),
    ],
)
def test_malformed_specs_are_refused(spec, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        SamplingParams(guided=spec).validate()


def test_unknown_tool_choice_name_is_refused():
    with pytest.raises(InvalidRequestError, match="'nope' is not in tools"):
        tool_guidance([WEATHER], ToolChoice(ToolChoiceMode.TOOL, "nope"), HERMES)


def test_guided_decoding_survives_the_grpc_round_trip():
    spec = tool_guidance([WEATHER], ToolChoice(ToolChoiceMode.ANY, disable_parallel=True), HERMES, {"type": "object"})
    req = GenerationRequest("r", [1, 2, 3], SamplingParams(max_tokens=9, guided=spec))
    back = request_from_pb(request_to_pb(req))
    assert back.sampling == req.sampling and hash(back.sampling.guided) == hash(spec)
    assert request_from_pb(request_to_pb(GenerationRequest("u", [1]))).sampling.guided is None


# -- grammars on the bundled tokenizer ---------------------------------------------------------
def test_compiled_once_per_spec(compiler):
    comp, _ = compiler
    spec = json_schema_guidance({"type": "object", "properties": {"n": {"type": "integer"}}, "title": "once"})
    before = comp.stats.compiles
    comp.matcher(spec), comp.matcher(spec), comp.validate(spec)
    assert comp.stats.compiles == before + 1


def test_auto_forces_the_call_once_the_trigger_is_written(compiler):
    comp, tok = compiler
    m = comp.matcher(tool_guidance([WEATHER], ToolChoice(), HERMES))
    _feed(m, tok, "Let me look that up.")
    assert len(_allowed(m, comp.vocab_size)) > 40000  # free text
    _feed(m, tok, "<tool_call>")
    allowed = _allowed(m, comp.vocab_size)
    assert [tok.decode([t]) for t in allowed] == ["\n"]
    _feed(m, tok, '\n{"name": "')
    names = {tok.decode([t]) for t in _allowed(m, comp.vocab_size)}
    assert names and all("get_weather".startswith(n) for n in names)


def test_none_never_opens_a_call(compiler):
    comp, tok = compiler
    m = comp.matcher(tool_guidance([WEATHER], ToolChoice(ToolChoiceMode.NONE), HERMES))
    _feed(m, tok, "Sure <tool_call")
    assert tok.encode(">")[0] not in _allowed(m, comp.vocab_size)


def test_disable_parallel_allows_one_call_then_only_the_end(compiler):
    comp, tok = compiler
    m = comp.matcher(tool_guidance([WEATHER], ToolChoice(ToolChoiceMode.ANY, disable_parallel=True), HERMES))
    _feed(m, tok, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert m.is_stopped


def test_released_matcher_is_rebuilt_from_its_tokens(compiler):
    comp, tok = compiler
    m = comp.matcher(
        json_schema_guidance({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    )
    tokens = tok.encode('{"a": 1')
    for t in tokens:
        assert m.accept(t)
    before = _allowed(m, comp.vocab_size)
    m.release()
    assert m.sync(tokens) and m.rebuilds == 1
    assert _allowed(m, comp.vocab_size) == before


def test_masks_touch_only_constrained_rows(compiler):
    comp, tok = compiler
    logits = torch.randn(4, comp.vocab_size)
    original = logits.clone()
    m = comp.matcher(json_schema_guidance({"type": "object"}))
    apply_grammars(logits, [2], [m])
    for row in (0, 1, 3):
        assert torch.equal(logits[row], original[row])  # bit for bit
    allowed = set(_allowed(m, comp.vocab_size))
    finite = set(torch.isfinite(logits[2]).nonzero().flatten().tolist())
    assert finite == allowed and tok.encode("{")[0] in allowed and tok.encode("x")[0] not in allowed
    assert torch.equal(logits[2][list(allowed)], original[2][list(allowed)])


def test_the_device_path_masks_like_the_cpu_path():
    from sluice.models.grammar.bitmask import mask_rows_numpy, mask_rows_torch

    forbidden = torch.rand(2, 1000) < 0.7
    a = torch.randn(5, 1000)
    b = a.clone()
    mask_rows_numpy(a, [1, 3], forbidden)
    mask_rows_torch(b, [1, 3], forbidden)
    assert torch.equal(a, b) and torch.isinf(a[1][forbidden[0]]).all() and torch.isfinite(a[0]).all()


def test_call_syntax_matches_json_dumps_layout() -> None:
    from sluice.tool_types import ToolCall

    syntax: CallSyntax = HERMES.call_syntax()
    rendered = HERMES.render_call(ToolCall("x", "get_weather", {"city": "Oslo"}))
    assert rendered == syntax.begin + "get_weather" + syntax.middle + json.dumps({"city": "Oslo"}) + syntax.end


def test_output_schema_with_tools_allows_its_json_or_a_call_but_not_free_text(compiler):
    comp, tok = compiler
    spec = tool_guidance(
        [WEATHER],
        ToolChoice(),
        HERMES,
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    )
    json_reply = comp.matcher(spec)
    _feed(json_reply, tok, '{"answer": "it rains"}')
    assert json_reply.is_stopped
    call = comp.matcher(spec)
    _feed(call, tok, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    free = comp.matcher(spec)
    assert not all(free.accept(t) for t in tok.encode("It rains."))
