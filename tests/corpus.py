"""Reproducible text for search's tests and benchmarks, nothing downloaded: Debian package
descriptions and a synthetic Zipfian generator (fixed seed) for sizes beyond them. Test
machinery, so it lives here and not in src/; bench/search/ imports it (`from tests import corpus`,
with the repository root on sys.path, as every bench script puts it).

`debian_packages()` reads `apt-cache dumpavail` (the package lists `apt-get update` fetched;
tens of thousands of short real documents: title = the one-line summary, body = the long
description, section and package name as extra fields). Debian 12's package lists carry only
the one-line summary; the long descriptions are in the Translation-en lists, which apt fetches
with `apt-get update -o Acquire::Languages=en` (a slim image's apt is set to `none`): where
they are, `debian_descriptions()` fills each body from them. Where apt has no lists it returns
nothing and `documents()` falls back to the generator. `queries()` draws query text from a
corpus's own vocabulary (mixing frequent and rare words, some phrases and operators).
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import subprocess
from collections import Counter
from typing import Any

Doc = dict[str, Any]
APT_LISTS = "/var/lib/apt/lists"
_FIELD = re.compile(r"^([A-Za-z-]+): ?(.*)$")


def _paragraphs(text: str) -> list[dict[str, str]]:
    out = []
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = None
        for line in para.split("\n"):
            if line.startswith(" ") and last:
                fields[last] += "\n" + line[1:]
            elif m := _FIELD.match(line):
                last = m.group(1)
                fields[last] = m.group(2)
        out.append(fields)
    return out


def debian_descriptions() -> dict[str, str]:
    """Package name → its long description (English), from apt's Translation-en lists; empty
    when apt has none (`apt-get update -o Acquire::Languages=en` fetches them)."""
    helper = "/usr/lib/apt/apt-helper"  # reads the lists whatever their compression
    if not os.path.exists(helper):
        return {}
    files = sorted(glob.glob(os.path.join(APT_LISTS, "*_i18n_Translation-en*")))
    try:
        out: dict[str, str] = {}
        for f in files:
            text = subprocess.run(
                [helper, "cat-file", f], capture_output=True, text=True, timeout=120, check=True
            ).stdout
            for fields in _paragraphs(text):
                name, desc = fields.get("Package"), fields.get("Description-en")
                if name and desc and name not in out:
                    out[name] = _long_part(desc)
        return out
    except (OSError, subprocess.SubprocessError):
        return {}


def _long_part(desc: str) -> str:
    body = desc.partition("\n")[2]
    return "\n".join("" if ln.strip() == "." else ln for ln in body.split("\n")).strip()


def debian_packages(limit: int | None = None) -> list[Doc]:
    if shutil.which("apt-cache") is None:
        return []
    try:
        text = subprocess.run(
            ["apt-cache", "dumpavail"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    docs: list[Doc] = []
    seen: set[str] = set()
    long_descriptions = debian_descriptions()
    for fields in _paragraphs(text):
        name, desc = fields.get("Package"), fields.get("Description")
        if not name or not desc or name in seen:
            continue
        seen.add(name)
        title = desc.partition("\n")[0]
        body = _long_part(desc) or long_descriptions.get(name, "")
        docs.append(
            {
                "id": name,
                "title": title.strip(),
                "body": body,
                "section": fields.get("Section", "misc"),
                "package": name,
            }
        )
        if limit is not None and len(docs) >= limit:
            break
    return docs


def zipf_documents(n: int, seed: int = 7, vocab_size: int = 20000, start: int = 0) -> list[Doc]:
    """n documents of Zipf-distributed made-up words (s ≈ 1.1), reproducible from `seed`."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "do", "xu", "be", "an", "or", "el", "is"]
    vocab = ["".join(rng.choice(syll) for _ in range(rng.randint(2, 4))) + str(i % 7) for i in range(vocab_size)]
    weights = [1.0 / (r + 1) ** 1.1 for r in range(vocab_size)]
    sections = ["alpha", "beta", "gamma", "delta"]
    docs = []
    for i in range(start, start + n):
        words = rng.choices(vocab, weights, k=rng.randint(20, 120))
        docs.append(
            {
                "id": f"z{i}",
                "title": " ".join(words[:6]),
                "body": " ".join(words[6:]),
                "section": sections[i % len(sections)],
            }
        )
    return docs


def documents(n: int, seed: int = 7) -> list[Doc]:
    """n documents: Debian's descriptions first, the Zipfian generator for the rest."""
    docs = debian_packages(n)
    if len(docs) < n:
        docs += zipf_documents(n - len(docs), seed=seed)
    return docs


def queries(docs: list[Doc], n: int, seed: int = 11) -> list[str]:
    """n query strings from the corpus's vocabulary: 1–3 words (frequent and rare), with some
    phrases, +required words and field queries, reproducible from `seed`."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    for d in docs:
        counts.update(w for w in re.findall(r"[a-z]{3,}", (d.get("title", "") + " " + d.get("body", "")).lower()))
    ranked = [w for w, c in counts.most_common() if c >= 2]
    if not ranked:
        raise ValueError("the corpus has no repeated words to query")
    head, tail = ranked[: max(1, len(ranked) // 20)], ranked
    out = []
    for i in range(n):
        words = [rng.choice(head if rng.random() < 0.4 else tail) for _ in range(rng.randint(1, 3))]
        kind = i % 10
        if kind == 7 and len(words) > 1:
            q = f'"{words[0]} {words[1]}" ' + " ".join(words[2:])
        elif kind == 8:
            q = "+" + " ".join(words)
        elif kind == 9:
            q = f"title:{words[0]} " + " ".join(words[1:])
        else:
            q = " ".join(words)
        out.append(q.strip())
    return out
