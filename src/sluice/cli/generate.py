"""`sluice generate`: one chat reply, streamed to stdout, with the engine in-process."""

from __future__ import annotations

import argparse
import sys
import time

from sluice.cli.common import add_kernel_args, add_model_args


def _generate(args: argparse.Namespace) -> int:
    from sluice.openmp_wait import sleep_when_idle

    sleep_when_idle()  # before torch loads (openmp_wait.py)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    sampling = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop or ()),
    )
    sampling.validate()
    started = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype, device=args.device, kernels=args.kernels)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_gib=0.25, numerics=args.numerics))
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    prompt = loaded.tokenizer.encode_chat(messages)
    print(f"[model {loaded.path.name} loaded in {time.perf_counter() - started:.1f}s]", file=sys.stderr)
    engine.add_request(GenerationRequest("cli", prompt, sampling))
    first = time.perf_counter()
    last = None
    while engine.has_unfinished():
        for event in engine.step():
            print(event.text, end="", flush=True)
            last = event
    print()
    if last is not None:
        secs = time.perf_counter() - first
        u = last.usage
        reason = last.finish_reason.value if last.finish_reason is not None else "unfinished"
        print(
            f"[{u.prompt_tokens} prompt + {u.output_tokens} output tokens, {reason}, "
            f"{u.output_tokens / secs:.1f} tok/s]",
            file=sys.stderr,
        )
        if last.error:
            print(f"error: {last.error}", file=sys.stderr)
            return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="generate one chat reply and stream it to stdout")
    gen.add_argument("--prompt", required=True, metavar="TEXT", help="the user message")
    gen.add_argument("--system", metavar="TEXT", default=None, help="a system prompt (default: the model template's)")
    gen.add_argument(
        "--max-tokens", type=int, default=256, metavar="N", help="maximum output tokens (default: %(default)s)"
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="sampling temperature; 0 = greedy (default: %(default)g)",
    )
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K most likely tokens; 0 = off")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass; 1.0 = off")
    gen.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    gen.add_argument("--stop", action="append", metavar="TEXT", help="stop sequence (repeatable)")
    add_model_args(gen)
    add_kernel_args(gen)
    gen.set_defaults(func=_generate)
