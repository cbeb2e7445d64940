"""Training data: line parsing (bad lines named), assistant-only loss masks, packing, sharding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sluice.models.tokenizer_loader import load_tokenizer
from sluice.train.data import dataset, sampler
from sluice.train.data.packing import pack
from sluice.train.data.records import ChatExample, TextExample, parse_record
from sluice.train.data.tokenize import Tokenized, tokenize_example
from sluice.train.errors import TrainDataError
from tests.tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", "llama")
    return load_tokenizer(folder)[0]


def test_chat_and_text_lines_parse():
    ex = parse_record(
        json.dumps(
            {
                "system": [{"type": "text", "text": "be brief"}],
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "yo"}]},
                ],
            }
        )
    )
    assert ex == ChatExample(
        (
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
        )
    )
    assert parse_record('{"text": "abc"}') == TextExample("abc")


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', "role must be"),
        ('{"messages": [{"role": "assistant", "content": [{"type": "image"}]}]}', "only text blocks"),
        ('{"text": ""}', "non-empty string"),
        ('{"text": "a", "extra": 1}', "unknown keys"),
        ('{"prompt": "a"}', 'needs "messages"'),
    ],
)
def test_bad_lines_say_what_is_wrong(line, problem):
    with pytest.raises(ValueError, match=problem):
        parse_record(line)


def test_loss_falls_on_assistant_turns_only(tok):
    ex = parse_record(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "A1"},
                    {"role": "user", "content": "more"},
                    {"role": "assistant", "content": "B2"},
                ]
            }
        )
    )
    out = tokenize_example(tok, ex)
    assert out.ids == tok.encode(tok.render_chat(list(ex.messages), add_generation_prompt=False))
    trained = tok.decode([i for i, m in zip(out.ids, out.mask) if m], skip_special_tokens=False)
    # each reply and its end-of-turn marker (the model learns to stop); no user text, no headers
    assert trained == "A1<|im_end|>\nB2<|im_end|>\n"


def test_text_lines_train_on_every_token_and_end_with_eos(tok):
    out = tokenize_example(tok, TextExample("hello"))
    assert out.ids[-1] == tok.eos_token_ids[0] and all(out.mask)


def test_packing_concatenates_and_pads_the_last_row_out_of_the_loss():
    a = Tokenized([1, 2, 3], [False, True, True])
    b = Tokenized([4, 5, 6, 7, 8], [True] * 5)
    tokens, mask = pack([a, b], seq_len=3, pad_id=0)
    assert tokens.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 0]]
    assert mask.tolist() == [[False, True, True], [True, True, True], [True, True, False]]


def test_bad_lines_are_reported_with_line_numbers(tmp_path: Path, tok):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "ok"}\n{oops\n\n{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(TrainDataError) as err:
        dataset.prepare(data, tok, "t", 16, tmp_path / "cache", skip_bad=False)
    assert err.value.problems[0].startswith(f"{data}:2: not valid JSON")
    assert err.value.problems[1].startswith(f"{data}:4: no assistant message")
    assert not (tmp_path / "cache" / "meta.json").exists()
    meta = dataset.prepare(data, tok, "t", 16, tmp_path / "cache", skip_bad=True)
    assert meta["examples"] == 1 and len(meta["bad_lines"]) == 2  # skipped, never silently


def test_the_cache_is_reused_until_the_file_changes(tmp_path: Path, tok):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "one"}\n')
    first = dataset.prepare(data, tok, "t", 8, tmp_path / "c", skip_bad=False)
    (tmp_path / "c" / "tokens.npy").write_bytes(b"")  # would fail to load if rebuilt-and-read
    assert dataset.prepare(data, tok, "t", 8, tmp_path / "c", skip_bad=False) == first
    data.write_text('{"text": "two two"}\n')
    assert dataset.prepare(data, tok, "t", 8, tmp_path / "c", skip_bad=False)["fingerprint"] != first["fingerprint"]
    assert dataset.load(tmp_path / "c").rows >= 1


def _rank_rows(rows: int, seed: int, step: int, batch: int, rank: int, world: int) -> list[int]:
    """A rank's contiguous B / world rows of a step's global batch, as the trainer slices them."""
    per = batch // world
    return sampler.global_batch(rows, seed, step, batch)[rank * per : (rank + 1) * per]


def test_a_step_reads_the_same_rows_on_any_world_size():
    rows, seed, batch = 10, 3, 4
    for step in range(6):  # crosses epochs (10 rows, 4 per step)
        whole = sampler.global_batch(rows, seed, step, batch)
        halves = _rank_rows(rows, seed, step, batch, 0, 2) + _rank_rows(rows, seed, step, batch, 1, 2)
        assert whole == halves
    epoch0 = [r for s in range(2) for r in sampler.global_batch(rows, seed, s, 5)]
    assert sorted(epoch0) == list(range(rows))  # an epoch is a permutation: every row once
    assert sampler.global_batch(rows, seed, 3, batch) == sampler.global_batch(rows, seed, 3, batch)
    assert np.asarray(sampler.global_batch(rows, seed + 1, 0, 10)).tolist() != epoch0
