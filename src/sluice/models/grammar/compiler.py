"""GuidedDecoding → a compiled grammar for one tokenizer, cached; one matcher per request.

Backed by llguidance (docs/ENGINE.md "Constrained decoding" says why it, not xgrammar).
"Compiling" is building an `LLMatcher` from the grammar text (lexer, Earley tables); the
cache keeps one fresh matcher per spec, and a request starts from a `deep_copy()` of it
(measured: under a microsecond, vs ~1 ms and up to hundreds of ms for a large grammar), so a
schema is compiled once however many requests use it. The cache is an LRU of `cache_size`
specs; it is shared by the caller's threads (validate before queueing) and the engine thread
(matcher at admission), hence the lock.

The tokenizer view (`LLTokenizer`, ~1 s to build for a 49k vocabulary) is built on first use,
so engines that never see a constrained request never pay for it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import tokenizers

from sluice.errors import InvalidRequestError
from sluice.models.grammar.closed_objects import close_objects
from sluice.models.grammar.lark import ANY_OBJECT, TEXT_SCHEMA, inline_json, tool_calls_grammar
from sluice.models.grammar.matcher import GrammarMatcher
from sluice.models.grammar.schema_check import check_schema
from sluice.types import GuidedDecoding, GuidedKind


def _library() -> Any:
    """llguidance, imported on the first constrained request: the gateway imports this module
    (to check a request's schema before routing it) and most processes never constrain, so
    the library's ~8 MiB resident is paid only by those that do."""
    try:
        import llguidance
    except ImportError:  # pragma: no cover - llguidance is a declared dependency
        raise InvalidRequestError(
            "constrained decoding is not available: the llguidance package is not installed"
        ) from None
    return llguidance


def _parse(text: str, where: str) -> Any:
    """A schema from its JSON text; the top-level `true` is {} and `false` (nothing) an error."""
    try:
        schema = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{where}: not valid JSON ({exc})") from None
    if schema is True:
        return {}
    if schema is False:
        raise InvalidRequestError(f"{where}: the schema `false` accepts no value")
    return schema


def _grammar_error(grammar: str, tokenizer: Any | None) -> str:
    """The library's complaint about `grammar` ("" if none); it never raises for user errors."""
    return _library().LLMatcher.validate_grammar(grammar, tokenizer)


def _json_grammar(schema: Any) -> str:
    return "%llguidance {}\nstart: " + inline_json(schema) + "\n"


def grammar_text(spec: GuidedDecoding, tokenizer: Any | None = None) -> str:
    """The grammar for `spec`, after the schema checks; raises InvalidRequestError naming the
    unsupported keyword or the library's objection. No tokenizer is needed (the HTTP process
    may call it through `check_guided` to refuse a request before it is routed)."""
    _library()
    if spec.kind is GuidedKind.JSON_OBJECT:
        return _json_grammar(ANY_OBJECT)
    if spec.kind is GuidedKind.JSON_SCHEMA:
        schema = _parse(spec.schema, "schema")
        check_schema(schema, "schema")
        grammar = _json_grammar(close_objects(schema))
        err = _grammar_error(grammar, tokenizer)
        if err:
            raise InvalidRequestError(f"schema: {err}")
        return grammar
    schemas: dict[str, Any] = {}
    for tool in spec.tools if spec.max_calls != 0 else ():  # tool_choice none: no call to shape
        where = f"tools.{tool.name}.input_schema"
        schema = _parse(tool.schema, where) if tool.schema else ANY_OBJECT
        try:
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                raise InvalidRequestError(f"{where}: a tool's input_schema must have type 'object'")
            check_schema(schema, where)
            err = _grammar_error(_json_grammar(schema), tokenizer)
            if err:
                raise InvalidRequestError(f"{where}: {err}")
        except InvalidRequestError:
            if tool.strict:
                raise
            schema = ANY_OBJECT  # best effort for a non-strict tool: well-formed JSON arguments
        schemas[tool.name] = close_objects(schema)
    if spec.schema:
        text_schema = _parse(spec.schema, "schema")
        check_schema(text_schema, "schema")
        schemas[TEXT_SCHEMA] = close_objects(text_schema)
    grammar = tool_calls_grammar(spec, schemas)
    err = _grammar_error(grammar, tokenizer)
    if err:
        raise InvalidRequestError(f"tool-call grammar: {err}")
    return grammar


def check_guided(spec: GuidedDecoding) -> None:
    """Validate `spec` without a tokenizer: the structural checks and every schema."""
    spec.validate()
    grammar_text(spec)


@dataclass(slots=True)
class CompilerStats:
    compiles: int = 0  # specs compiled (cache misses that succeeded)
    hits: int = 0  # matchers started from a cached grammar
    compile_seconds: float = 0.0


class GrammarCompiler:
    """Compiles specs for one tokenizer and hands out per-request matchers (thread-safe)."""

    def __init__(
        self, tokenizer: tokenizers.Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = 256
    ):
        self._backend = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._cache_size = cache_size
        self._cache: OrderedDict[GuidedDecoding, Any] = OrderedDict()
        self._lock = threading.Lock()  # the cache and the stats
        self._tokenizer_lock = threading.Lock()
        self._tokenizer: Any | None = None
        self.stats = CompilerStats()

    def _llg_tokenizer(self) -> Any:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = _library().LLTokenizer(
                    self._backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos
                )
            return self._tokenizer

    def _template(self, spec: GuidedDecoding) -> Any:
        with self._lock:
            template = self._cache.get(spec)
            if template is not None:
                self._cache.move_to_end(spec)
                self.stats.hits += 1
                return template
        # Compile outside the cache lock: a long compile (the library releases the GIL while
        # it builds) must not hold up the engine thread's cache hits. Two threads compiling the
        # same new spec at once both succeed; one result is kept.
        _library()
        started = time.perf_counter()
        tokenizer = self._llg_tokenizer()
        template = _library().LLMatcher(tokenizer, grammar_text(spec, tokenizer), log_level=0)
        if template.is_error():
            raise InvalidRequestError(f"constrained decoding: {template.get_error()}")
        with self._lock:
            self.stats.compile_seconds += time.perf_counter() - started
            self.stats.compiles += 1
            self._cache[spec] = template
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return template

    def validate(self, spec: GuidedDecoding) -> None:
        """Compile (or find) `spec`'s grammar; raises InvalidRequestError naming the problem."""
        spec.validate()
        self._template(spec)

    def matcher(self, spec: GuidedDecoding) -> GrammarMatcher:
        """A fresh matcher for one request (compiles on a cache miss)."""
        return GrammarMatcher(self._template(spec))
