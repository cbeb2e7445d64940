"""Tokenizer, chat template, incremental detokenization and stop sequences on the bundled model."""

from __future__ import annotations

import pytest

from sluice.models.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "  leading spaces and\ttabs\nand newlines\n\n",
    "Ünïcödé: café, naïve, 日本語, 🙂🚀 and emoji",
    "code: def f(x):\n    return x ** 2  # square",
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from sluice.models.loader import default_model_path

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_gguf_tokenizer_matches_transformers_conversion(bundled, hf_tokenizer):
    tok = bundled.tokenizer
    for text in TEXTS:
        assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text)) == text


def test_digits_split_one_by_one_like_the_original_smollm2_tokenizer(bundled):
    # llama.cpp's `smollm` pre-tokenizer (and SmolLM2's tokenizer.json) split every digit;
    # transformers' GGUF converter does not, so here we check against the rule itself.
    tok = bundled.tokenizer
    ids = tok.encode("2024")
    assert len(ids) == 4 and [tok.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_chat_template_matches_transformers(bundled, hf_tokenizer):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    ours = bundled.tokenizer.render_chat(msgs)
    theirs = hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
    assert bundled.tokenizer.encode_chat(msgs)[:1] == [bundled.tokenizer.backend.token_to_id("<|im_start|>")]


def _stream(bundled, text: str, stop=()):
    tok = bundled.tokenizer
    detok = IncrementalDetokenizer(tok.backend, tuple(stop))
    pieces = []
    for token_id in tok.encode(text):
        detok.add_token(token_id)
        pieces.append(detok.take())
        if detok.stop_matched:
            break
    pieces.append(detok.take(final=True))
    return pieces, detok


def test_never_emits_half_a_utf8_character(bundled):
    text = "日本語 🙂🚀 ok"
    pieces, _ = _stream(bundled, text)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # the emoji are several byte-level tokens each: some steps must have emitted nothing
    assert any(p == "" for p in pieces)


@pytest.mark.parametrize("stop", ["quick brown", "brown fox", "k b", "dog."])
def test_stop_sequence_is_cut_and_never_sent(bundled, stop):
    text = "The quick brown fox jumps over the lazy dog. And again."
    pieces, detok = _stream(bundled, text, [stop])
    assert detok.stop_matched == stop
    sent = "".join(pieces)
    assert sent == text[: text.index(stop)]
    assert stop not in sent


def test_possible_stop_prefix_is_held_back_then_released(bundled):
    tok = bundled.tokenizer
    detok = IncrementalDetokenizer(tok.backend, ("brown fox",))
    for t in tok.encode("a brown"):
        detok.add_token(t)
    assert detok.take() == "a "  # "brown" may begin "brown fox": held back
    for t in tok.encode(" bear"):
        detok.add_token(t)
    assert detok.take() == "brown bear"  # ruled out: released
    assert detok.stop_matched is None
    pieces, detok = _stream(bundled, "a brown bear and a brown fox", ["brown fox"])
    assert detok.stop_matched == "brown fox"
    assert "".join(pieces) == "a brown bear and a "
