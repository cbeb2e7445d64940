#!/usr/bin/env python3
"""How far the fast numerics (int8 activations x 4-bit weights) drift from exact fp32.

On the bundled SmolLM2-135M-Instruct, for three ways of computing, against transformers (fp32,
the correctness reference):

  torch    sluice's portable path (fp32 weights)
  exact    the CPU kernels, numerics = exact (the default)
  fast     the CPU kernels, numerics = fast
  exact+kv16 / fast+kv16   the same with the opt-in 16-bit K/V cache (kv_cache_dtype = float16)

* greedy agreement: --prompts chat prompts (default 24) x --tokens (default 128) greedy tokens
  (EOS ignored, all prompts in one engine batch); per prompt, the tokens before the first one
  that differs from transformers' greedy output. Reported: that prefix over all tokens ("share
  of greedy tokens equal"), and how many prompts match to the end. After the first difference
  the continuations are different texts, so later positions are not compared.
* perplexity of a fixed English text (below, 358 tokens) from one prefill with every
  position's logits: exp(mean negative log-likelihood of each next token).

    .venv/bin/python bench/kernels/numerics_quality.py            # ~10 min on 2 cores (transformers dominates)
    .venv/bin/python bench/kernels/numerics_quality.py --prompts 4 --tokens 32   # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

TEXT = (
    "The first maps were drawn to answer simple questions: where is the water, which path is safe, and how far is "
    "the next village. Travellers scratched lines into clay or painted them on hides, and the scale of these "
    "drawings was set by a day's walk rather than by any measured unit. As trade grew, merchants needed maps that "
    "other people could read, so symbols became more regular, and a river or a mountain pass was drawn the same "
    "way from one sheet to the next. Sailors added their own knowledge. They recorded depths near harbours, the "
    "direction of steady winds, and the bearings between headlands, and their charts were copied by hand and "
    "corrected after every voyage. Printing changed the trade again. Once a plate was engraved, hundreds of "
    "identical copies could be pulled from it, and errors spread as quickly as good information did. Surveyors "
    "then began to measure the land itself, walking chains across fields and sighting angles from hilltops to "
    "build long triangles that covered whole countries. The work took decades, but it produced maps on which a "
    "distance could be measured with a ruler and trusted. In the last century, aerial photographs and then "
    "satellites replaced much of that walking. Today a phone can show a street plan, the traffic on it, and the "
    "route to a door, and it updates the picture many times a minute. Yet the old questions remain the same: "
    "where is the water, which path is safe, and how far is the next place we want to reach. A good map still "
    "leaves things out on purpose, because a drawing that showed everything would be as large and as confusing "
    "as the land. Choosing what to omit is the mapmaker's real craft, and every map, however modern, is an "
    "argument about what matters to the person who will hold it."
)
TOPICS = [
    "rivers",
    "glaciers",
    "honeybees",
    "volcanoes",
    "chess openings",
    "sourdough bread",
    "lighthouses",
    "coral reefs",
    "jazz",
    "windmills",
    "comets",
    "silk",
    "owls",
    "tides",
    "clocks",
    "salt",
    "deserts",
    "violins",
    "bridges",
    "tea",
    "copper",
    "maple trees",
    "sailing ships",
    "caves",
    "trains",
    "the moon",
]
ASKS = [
    "Explain what {} are and why they matter.",
    "Give three surprising facts about {}.",
    "Write a short paragraph for children about {}.",
    "What would a beginner need to know about {}?",
]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.encode_chat([{"role": "user", "content": ASKS[i % len(ASKS)].format(TOPICS[i % len(TOPICS)])}])
        for i in range(n)
    ]


def sluice_greedy(loaded, numerics: str, prompts: list[list[int]], tokens: int, kv: str = "auto") -> list[list[int]]:
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.types import GenerationRequest, SamplingParams

    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=2048, numerics=numerics, kv_cache_dtype=kv))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    reqs = [GenerationRequest(f"q{i}", p, params) for i, p in enumerate(prompts)]
    out = engine.generate(reqs)
    return [out[r.request_id].token_ids for r in reqs]


def hf_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def sluice_perplexity(loaded, numerics: str, ids: list[int], kv: str = "auto") -> float:
    from sluice.engine.kv_memory import kv_cache_dtype
    from sluice.models.attention import AttentionMetadata, PrefillSpan
    from sluice.models.kernels import Numerics

    m = loaded.model
    cfg = m.config
    n = len(ids)
    dtype = kv_cache_dtype(kv, m.dtype)
    caches = [
        (
            torch.zeros(cfg.num_kv_heads, n, cfg.head_dim, dtype=dtype),
            torch.zeros(cfg.num_kv_heads, n, cfg.head_dim, dtype=dtype),
        )
        for _ in range(cfg.num_layers)
    ]
    slots = torch.arange(n)
    meta = AttentionMetadata(slot_mapping=slots, prefills=[PrefillSpan(0, n, slots, None)], block_size=1)
    logits = m.forward(
        torch.tensor(ids), torch.arange(n), meta, caches, torch.arange(n - 1), numerics=Numerics(numerics)
    )
    return _ppl(logits, ids)


def hf_perplexity(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return _ppl(logits, ids)


def _ppl(logits: torch.Tensor, ids: list[int]) -> float:
    nll = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:]), reduction="mean")
    return math.exp(float(nll))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--modes", default="torch,exact,fast,exact+kv16,fast+kv16", help="comma-separated (default: all five)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers
    from transformers import AutoModelForCausalLM

    from sluice.models.loader import default_model_path, load_model

    transformers.logging.set_verbosity_error()
    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    on_kernels = load_model(progress=False, kernels="auto")
    if not on_kernels.model.uses_kernels:
        raise SystemExit("the kernels are unavailable on this machine; the fast numerics need them")
    wanted = args.modes.split(",")
    modes = {
        "exact": (on_kernels, "exact", "auto"),
        "fast": (on_kernels, "fast", "auto"),
        "exact+kv16": (on_kernels, "exact", "float16"),
        "fast+kv16": (on_kernels, "fast", "float16"),
    }
    if "torch" in wanted:
        modes["torch"] = (load_model(progress=False, kernels="torch"), "exact", "auto")
    modes = {name: modes[name] for name in wanted}
    prompts = chat_prompts(on_kernels.tokenizer, args.prompts)
    text_ids = on_kernels.tokenizer.encode(TEXT)
    print(f"{len(prompts)} prompts x {args.tokens} tokens; perplexity text: {len(text_ids)} tokens", file=sys.stderr)
    t = time.perf_counter()
    reference = [hf_greedy(hf, pr, args.tokens) for pr in prompts]
    print(f"transformers greedy: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    result: dict = {"transformers": {"perplexity": hf_perplexity(hf, text_ids)}}
    for name, (loaded, numerics, kv) in modes.items():
        got = sluice_greedy(loaded, numerics, prompts, args.tokens, kv)
        prefixes = [common_prefix(r, g) for r, g in zip(reference, got)]
        result[name] = {
            "equal_token_share": sum(prefixes) / (len(prompts) * args.tokens),
            "prompts_equal_to_the_end": sum(pf == args.tokens for pf in prefixes),
            "first_difference_median": sorted(prefixes)[len(prefixes) // 2],
            "perplexity": sluice_perplexity(loaded, numerics, text_ids, kv),
        }
    print(f"\n{'mode':<14}{'equal tokens':>14}{'prompts equal':>15}{'perplexity':>12}", file=sys.stderr)
    for name, r in result.items():
        if name == "transformers":
            print(f"{name:<14}{'(reference)':>14}{'':>15}{r['perplexity']:12.4f}", file=sys.stderr)
        else:
            print(
                f"{name:<14}{100 * r['equal_token_share']:13.1f}%{r['prompts_equal_to_the_end']:>9}/{len(prompts):<5}"
                f"{r['perplexity']:12.4f}",
                file=sys.stderr,
            )
    print(
        json.dumps(
            {
                "bench": "numerics_quality",
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "prompts": len(prompts),
                "tokens": args.tokens,
                "text_tokens": len(text_ids),
                "result": result,
            }
        )
    )


if __name__ == "__main__":
    main()
