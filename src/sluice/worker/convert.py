"""GenerationRequest / GenerationEvent ⇄ protobuf messages (one place, both directions)."""

from __future__ import annotations

import dataclasses
import json

from sluice.engine.stats import EngineStats
from sluice.errors import InvalidRequestError
from sluice.types import (
    AdapterRef,
    CallSyntax,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    GuidedDecoding,
    GuidedKind,
    SamplingParams,
    TokenLogprob,
    ToolGrammar,
    Usage,
)
from sluice.worker.proto import engine_pb2 as pb


def request_to_pb(req: GenerationRequest) -> pb.GenerateRequest:
    s = req.sampling
    sampling = pb.Sampling(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        stop=list(s.stop),
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
    )
    if s.seed is not None:
        sampling.seed = s.seed
    if s.guided is not None:
        sampling.guided.CopyFrom(guided_to_pb(s.guided))
    if s.logprobs is not None:
        sampling.logprobs = s.logprobs
    if s.prompt_logprobs is not None:
        sampling.prompt_logprobs = s.prompt_logprobs
    return pb.GenerateRequest(
        request_id=req.request_id,
        prompt_token_ids=req.prompt_token_ids,
        sampling=sampling,
        priority=req.priority,
        tenant=req.tenant,
        resumed_output_ids=req.resumed_output_ids,
        resumed_text_chars=req.resumed_text_chars,
        adapter_name=req.adapter.name if req.adapter else "",
        adapter_source=req.adapter.source if req.adapter else "",
    )


def request_from_pb(msg: pb.GenerateRequest) -> GenerationRequest:
    s = msg.sampling
    sampling = SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=s.seed if s.HasField("seed") else None,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        guided=guided_from_pb(s.guided) if s.HasField("guided") else None,
        logprobs=s.logprobs if s.HasField("logprobs") else None,
        prompt_logprobs=s.prompt_logprobs if s.HasField("prompt_logprobs") else None,
    )
    return GenerationRequest(
        request_id=msg.request_id,
        prompt_token_ids=list(msg.prompt_token_ids),
        sampling=sampling,
        priority=msg.priority,
        tenant=msg.tenant,
        resumed_output_ids=list(msg.resumed_output_ids),
        resumed_text_chars=msg.resumed_text_chars,
        adapter=adapter_from_pb(msg.adapter_name, msg.adapter_source),
    )


def adapter_from_pb(name: str, source: str) -> AdapterRef | None:
    if not name and not source:
        return None
    if not name or not source:
        raise InvalidRequestError("a LoRA adapter needs both a name and a source")
    return AdapterRef(name, source)


def guided_to_pb(g: GuidedDecoding) -> pb.Guided:
    out = pb.Guided(
        kind=g.kind.value,
        schema=g.schema,
        tools=[pb.ToolGrammar(name=t.name, schema=t.schema, strict=t.strict) for t in g.tools],
        allow_text=g.allow_text,
        min_calls=g.min_calls,
    )
    if g.calls is not None:
        c = g.calls
        out.calls.CopyFrom(
            pb.CallSyntax(trigger=c.trigger, begin=c.begin, middle=c.middle, end=c.end, separator=c.separator)
        )
    if g.max_calls is not None:
        out.max_calls = g.max_calls
    return out


def guided_from_pb(msg: pb.Guided) -> GuidedDecoding:
    try:
        kind = GuidedKind(msg.kind)
    except ValueError:
        raise InvalidRequestError(f"guided decoding: unknown kind {msg.kind!r}") from None
    c = msg.calls
    return GuidedDecoding(
        kind=kind,
        schema=msg.schema,
        tools=tuple(ToolGrammar(t.name, t.schema, t.strict) for t in msg.tools),
        calls=CallSyntax(c.trigger, c.begin, c.middle, c.end, c.separator) if msg.HasField("calls") else None,
        allow_text=msg.allow_text,
        min_calls=msg.min_calls,
        max_calls=msg.max_calls if msg.HasField("max_calls") else None,
    )


def event_to_pb(ev: GenerationEvent) -> pb.Event:
    out = pb.Event(
        text=ev.text,
        token_ids=ev.token_ids,
        finished=ev.finished,
        finish_reason=ev.finish_reason.value if ev.finish_reason else "",
        usage=pb.Usage(
            prompt_tokens=ev.usage.prompt_tokens,
            output_tokens=ev.usage.output_tokens,
            cached_tokens=ev.usage.cached_tokens,
        ),
    )
    if ev.stop_sequence is not None:
        out.stop_sequence = ev.stop_sequence
    if ev.error is not None:
        out.error = ev.error
    if ev.queue_time_s is not None:
        out.queue_time_s = ev.queue_time_s
    if ev.logprobs:
        out.logprobs.extend(logprob_to_pb(lp) for lp in ev.logprobs)
    if ev.prompt_logprobs is not None:
        out.has_prompt_logprobs = True
        out.prompt_logprobs.extend(logprob_to_pb(lp) for lp in ev.prompt_logprobs[1:] if lp is not None)
    return out


def logprob_to_pb(lp: TokenLogprob) -> pb.Logprob:
    return pb.Logprob(
        token_id=lp.token_id, logprob=lp.logprob, top_ids=[t for t, _ in lp.top], top_logprobs=[v for _, v in lp.top]
    )


def logprob_from_pb(msg: pb.Logprob) -> TokenLogprob:
    return TokenLogprob(msg.token_id, msg.logprob, tuple(zip(msg.top_ids, msg.top_logprobs)))


def event_from_pb(request_id: str, msg: pb.Event) -> GenerationEvent:
    u = msg.usage
    return GenerationEvent(
        request_id=request_id,
        text=msg.text,
        token_ids=list(msg.token_ids),
        finished=msg.finished,
        finish_reason=FinishReason(msg.finish_reason) if msg.finish_reason else None,
        stop_sequence=msg.stop_sequence if msg.HasField("stop_sequence") else None,
        usage=Usage(u.prompt_tokens, u.output_tokens, u.cached_tokens),
        error=msg.error if msg.HasField("error") else None,
        queue_time_s=msg.queue_time_s if msg.HasField("queue_time_s") else None,
        logprobs=[logprob_from_pb(lp) for lp in msg.logprobs],
        prompt_logprobs=[None, *map(logprob_from_pb, msg.prompt_logprobs)] if msg.has_prompt_logprobs else None,
    )


def stats_to_json(stats: EngineStats) -> str:
    return json.dumps(dataclasses.asdict(stats))


def stats_from_json(text: str) -> EngineStats:
    known = {f.name for f in dataclasses.fields(EngineStats)}
    return EngineStats(**{k: v for k, v in json.loads(text).items() if k in known})
