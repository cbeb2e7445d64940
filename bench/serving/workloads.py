"""The prompts of the speculative-decoding benchmarks: repetitive work (the model copies from its
prompt, which n-gram speculation exploits) and free text. Shared by bench/serving/speculative.py (engine
alone) and bench/serving/vs_llamacpp.py (`--workload`, served against llama.cpp)."""

from __future__ import annotations

import json

PARAGRAPH = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the bay. Every evening the keeper "
    "climbed the one hundred and twelve steps, trimmed the wick, wound the clockwork that turned the "
    "lens, and wrote the weather in a leather book. Ships passing in the night saw the beam sweep "
    "across the water every ten seconds and knew where the rocks were."
)
TYPOS = (
    "The lighthouse stood on a narow spit of rock at the mouth of the bay. Every evening the keeper "
    "climbed the one hundred and twelve stepps, trimmed the wick, wound the clockwork that turned the "
    "lens, and wrote the wether in a leather book. Ships passing in the night saw the beam sweep "
    "accross the water every ten seconds and knew where the rocks were."
)
CODE = (
    "def summarize(values):\n    x = 0\n    count = 0\n    for value in values:\n        x = x + value\n"
    "        count = count + 1\n    if count == 0:\n        return None\n    mean = x / count\n"
    '    return {"total": x, "count": count, "mean": mean}\n'
)
RECORD = {
    "id": 4182,
    "name": "Ada Lovelace",
    "email": "ada@example.org",
    "age": 36,
    "address": {"street": "12 St James's Square", "city": "London", "country": "United Kingdom"},
    "interests": ["mathematics", "poetry", "the Analytical Engine"],
    "active": True,
}
WORKLOADS = {
    "quote": "Repeat the following text exactly, word for word:\n\n" + PARAGRAPH,
    "edit": "Correct the spelling mistakes in this text and return the whole corrected text:\n\n" + TYPOS,
    "code": "Rename the variable x to total in this Python function and show the whole function:\n\n" + CODE,
    "json": "Return this JSON object with age set to 37 and everything else unchanged:\n\n" + json.dumps(RECORD),
    "free-story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "free-explain": "Explain how a rainbow forms, step by step.",
}
