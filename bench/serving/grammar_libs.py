"""Compare grammar libraries for constrained decoding on the bundled tokenizer: xgrammar vs llguidance.

What it measures, per library (each phase interleaved between the two, several rounds):
- JSON-schema coverage: for each keyword probe, does compilation succeed, fail with an error, or
  succeed while *ignoring* the keyword (a random walk through the grammar then produces an
  instance the `jsonschema` checker rejects: the silent-unconstrained case we must never ship);
- compile time of a realistic tool schema, cold (fresh compiler/cache) and cached;
- per-step mask cost with 8 and 32 rows: fill every row's bitmask, then advance each matcher by
  one allowed token (the engine does both once per decode step).

A readable table goes to stderr, one JSON line with every figure to stdout.
Needs both libraries importable (it was run with them installed into scratch folders, see
docs/ENGINE.md "Constrained decoding"). Usage:
    PYTHONPATH=src:<xgrammar dir>:<llguidance dir> python bench/serving/grammar_libs.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import torch

from sluice.models.tokenizer_loader import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
from bench.common import log

TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and state"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string", "enum": ["temp", "wind", "rain"]}, "maxItems": 3},
    },
    "required": ["location", "unit"],
    "additionalProperties": False,
}

SHORT = torch.zeros(0, dtype=torch.bool)  # per token id: decodes to at most one character

PROBES: dict[str, dict[str, Any]] = {
    "enum": {"enum": ["a", "b", 3]},
    "const": {"const": "fixed"},
    "minimum/maximum": {"type": "integer", "minimum": 3, "maximum": 7},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "multipleOf": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 4},
    "pattern": {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"},
    "format: date-time": {"type": "string", "format": "date-time"},
    "format: email": {"type": "string", "format": "email"},
    "format: uuid": {"type": "string", "format": "uuid"},
    "minItems/maxItems": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
    "uniqueItems": {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 2},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}},
    "required": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    "additionalProperties: false": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": False,
    },
    "additionalProperties: schema": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
    "patternProperties": {
        "type": "object",
        "patternProperties": {"^x_": {"type": "integer"}},
        "additionalProperties": False,
        "minProperties": 1,
    },
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^[a-c]$"}, "minProperties": 1},
    "minProperties/maxProperties": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "minProperties": 2,
        "maxProperties": 2,
    },
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
    "oneOf": {"oneOf": [{"type": "integer", "maximum": 0}, {"type": "integer", "minimum": 10}]},
    "allOf": {"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 9}]},
    "type list (nullable)": {"type": ["string", "null"], "maxLength": 3},
    "$ref/$defs": {"$defs": {"p": {"type": "integer", "minimum": 0}}, "type": "array", "items": {"$ref": "#/$defs/p"}},
    "recursive $ref": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}},
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/n",
    },
    "not": {"type": "integer", "not": {"const": 3}},
    "if/then/else": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "if": {"required": ["a"]},
        "then": {"required": ["b"]},
    },
    "dependentRequired": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]},
    },
}


# -- adapters: the same four operations on each library ---------------------------------------
class Lib:
    name = ""

    def compile(self, schema: dict[str, Any]) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None: ...
    def accept(self, m: Any, token: int) -> bool:
        raise NotImplementedError

    def done(self, m: Any) -> bool:
        raise NotImplementedError

    def fresh(self) -> None: ...


class XGrammar(Lib):
    name = "xgrammar 0.2.8"

    def __init__(self, tok: Any, eos: list[int]):
        import xgrammar as xgr

        self.xgr = xgr
        vocab = [tok.backend.id_to_token(i) for i in range(tok.vocab_size)]
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size, stop_token_ids=eos)
        self.fresh()

    def fresh(self) -> None:
        self.compiler = self.xgr.GrammarCompiler(self.info, max_threads=1)

    def compile(self, schema):  # xgrammar's strict_mode: unlisted properties are not generated
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers, bitmask):
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)

    def accept(self, m, token):
        return m.accept_token(token)

    def done(self, m):
        return m.is_terminated()


class LLGuidance(Lib):
    name = "llguidance 1.9.1"

    def __init__(self, tok: Any, eos: list[int]):
        import llguidance
        import llguidance.torch as llt

        self.llg, self.llt = llguidance, llt
        self.tokenizer = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=eos[0])
        self.fresh()

    def fresh(self) -> None:
        pass  # llguidance keeps no cross-request cache: each LLMatcher builds its parser from the grammar

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        err = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if err:
            raise ValueError(err)
        return grammar

    def matcher(self, compiled):
        m = self.llg.LLMatcher(self.tokenizer, compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, matchers, bitmask):
        for i, m in enumerate(matchers):
            self.llt.fill_next_token_bitmask(m, bitmask, i)

    def accept(self, m, token):
        return m.consume_token(token)

    def done(self, m):
        return m.is_stopped()


# -- measurements ---------------------------------------------------------------------------
_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed(bitmask_row: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = ((bitmask_row[:, None] >> _SHIFTS) & 1).flatten()[:vocab]
    return bits.nonzero().flatten()


def random_walk(lib: Lib, compiled: Any, vocab: int, eos: int, rng: random.Random, decode: Callable) -> str | None:
    """One random instance of the grammar (biased towards one-character tokens so it ends)."""
    m = lib.matcher(compiled)
    mask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)
    out: list[int] = []
    for _ in range(400):
        if lib.done(m):
            return decode(out)
        lib.fill([m], mask)
        ids = allowed(mask[0], vocab)
        if ids.numel() == 0:
            return None
        if bool((ids == eos).any()) and rng.random() < 0.7:
            return decode(out)
        short = ids[SHORT[ids]]
        pool = short if short.numel() and rng.random() < 0.8 else ids
        t = int(pool[rng.randrange(pool.numel())])
        if not lib.accept(m, t):
            return None
        out.append(t)
    return None


def coverage(lib: Lib, vocab: int, eos: int, decode: Callable, walks: int = 12) -> dict[str, str]:
    rng = random.Random(0)
    res: dict[str, str] = {}
    for name, schema in PROBES.items():
        try:
            compiled = lib.compile(schema)
            lib.matcher(compiled)
        except Exception as exc:
            res[name] = "error: " + str(exc).splitlines()[0][:70]
            continue
        bad_json = bad_schema = done = 0
        for _ in range(walks):
            text = random_walk(lib, compiled, vocab, eos, rng, decode)
            if text is None:
                continue
            done += 1
            try:
                value = json.loads(text)
            except ValueError:
                bad_json += 1
                continue
            try:
                jsonschema.validate(value, schema)
            except jsonschema.ValidationError:
                bad_schema += 1
        if bad_json or bad_schema:
            res[name] = f"IGNORED ({bad_schema} schema-invalid, {bad_json} not JSON, of {done})"
        else:
            res[name] = f"enforced ({done} walks)"
    return res


def compile_times(lib: Lib, rounds: int) -> tuple[float, float]:
    cold, cached = [], []
    for r in range(rounds):
        lib.fresh()
        schema = dict(TOOL_SCHEMA, title=f"round{r}")  # a new schema text: no cache can answer it
        t = time.perf_counter()
        lib.matcher(lib.compile(schema))
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        lib.matcher(lib.compile(schema))
        cached.append(time.perf_counter() - t)
    return statistics.median(cold), statistics.median(cached)


def step_cost(lib: Lib, rows: int, steps: int, vocab: int, eos: int) -> float:
    """Median seconds per step to fill `rows` masks and advance each row by one allowed token."""
    compiled = lib.compile(TOOL_SCHEMA)
    rng = random.Random(1)
    matchers = [lib.matcher(compiled) for _ in range(rows)]
    mask = torch.zeros((rows, (vocab + 31) // 32), dtype=torch.int32)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        lib.fill(matchers, mask)
        times.append(time.perf_counter() - t)
        for i, m in enumerate(matchers):
            ids = allowed(mask[i], vocab)
            ids = ids[ids != eos]
            if lib.done(m) or ids.numel() == 0:
                matchers[i] = m = lib.matcher(compiled)
                continue
            token = int(ids[rng.randrange(ids.numel())])
            t = time.perf_counter()
            lib.accept(m, token)
            times[-1] += time.perf_counter() - t
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    tok, cfg = load_tokenizer()
    eos = list(tok.eos_token_ids)
    vocab = tok.vocab_size
    decode = lambda ids: tok.backend.decode(ids)  # noqa: E731
    global SHORT
    SHORT = torch.tensor([len(decode([t])) <= 1 for t in range(vocab)])
    libs: list[Lib] = [XGrammar(tok, eos), LLGuidance(tok, eos)]
    log("== JSON-schema coverage (probe: result)")
    cov = {lib.name: coverage(lib, vocab, eos[0], decode) for lib in libs}
    for probe in PROBES:
        log(f"  {probe:30s} " + " | ".join(f"{lib.name}: {cov[lib.name][probe]}" for lib in libs))
    result: dict[str, Any] = {"coverage": cov, "compile_ms": {}, "step_ms": {}}
    log(f"== compile (tool schema), median of {args.rounds}")
    for lib in libs:
        cold, cached = compile_times(lib, args.rounds)
        result["compile_ms"][lib.name] = {"cold": cold * 1e3, "cached": cached * 1e3}
        log(f"  {lib.name:18s} cold {cold * 1e3:8.2f} ms   cached {cached * 1e3:8.3f} ms")
    log(f"== per-step mask fill + advance: median of {args.rounds} alternating rounds of {args.steps} steps")
    for rows in (8, 32):
        per_lib: dict[str, list[float]] = {lib.name: [] for lib in libs}
        for r in range(args.rounds):
            for lib in libs if r % 2 == 0 else libs[::-1]:
                per_lib[lib.name].append(step_cost(lib, rows, args.steps, vocab, eos[0]) * 1e3)
        for lib in libs:
            ms = statistics.median(per_lib[lib.name])
            result["step_ms"][f"{lib.name} rows {rows}"] = ms
            log(f"  {lib.name:18s} rows {rows:2d}: {ms:7.3f} ms/step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
