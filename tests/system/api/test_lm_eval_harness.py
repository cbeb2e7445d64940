"""lm-evaluation-harness (the real client, from PyPI) against a real `sluice serve`.

Two tasks on local data written by the test: a multiple-choice task scored by loglikelihood
(`local-completions`: `echo` + `logprobs` on /v1/completions, how harnesses score answers) and a
generate-until task (`local-completions` and `local-chat-completions`). The loglikelihoods the
harness got from sluice equal those transformers computes on the same GGUF model (fp32), token
for token of the harness's own tokenization.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

# the harness imports a large stack (datasets, evaluate) and transformers loads the reference
# model: on a loaded two-core machine that alone can take minutes
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pyproject.toml)")
KEY = SHARED_KEY
TOL = 5e-3  # a sum of a few per-token fp32 logprobs (kernels on quantized blocks vs dequantized fp32)

MC_DOCS = [
    {"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "purple"], "answer": 0},
    {"question": "How many legs does a cat have?", "choices": ["two", "four", "eight"], "answer": 1},
    {"question": "Which animal barks?", "choices": ["a fish", "a bird", "a dog"], "answer": 2},
]
GEN_DOCS = [{"prompt": "1, 2, 3, 4,", "target": " 5"}, {"prompt": "Monday, Tuesday,", "target": " Wednesday"}]


def _write_tasks(root: Path) -> Path:
    data = root / "data"
    data.mkdir()
    (data / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (data / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "sluice_mc.yaml").write_text(f"""task: sluice_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (tasks / "sluice_gen.yaml").write_text(f"""task: sluice_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n", ","]
  max_gen_toks: 6
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
""")
    return tasks


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/system/api/conftest.py: the bundled model behind KEY


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The server's own tokenizer as a transformers folder (the harness tokenizes with it): the
    ids it sends are the ones sluice would make (transformers' GGUF conversion is slower and
    gives the same vocabulary)."""
    from sluice.models.tokenizer_loader import load_tokenizer

    tok, _ = load_tokenizer()
    out = tmp_path_factory.mktemp("tokenizer")
    tok.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tok.eos_token, "bos_token": tok.bos_token}
        )
    )
    return out


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    return tmp_path


def _evaluate(model: str, model_args: dict, tasks: list[str], include: Path, **kwargs) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
        **kwargs,
    )


def test_loglikelihood_and_generate_until_with_local_completions(server, tokenizer_dir, offline, hf_bundled):
    from transformers import AutoTokenizer

    tasks = _write_tasks(offline)
    args = {
        "model": MODEL,
        "base_url": server.base_url + "/v1/completions",
        "tokenizer": str(tokenizer_dir),
        "tokenizer_backend": "huggingface",
        "num_concurrent": 1,
        "max_retries": 1,
    }
    out = _evaluate("local-completions", args, ["sluice_mc", "sluice_gen"], tasks)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    samples = out["samples"]["sluice_mc"]
    assert len(samples) == len(MC_DOCS)
    checked = 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            got_ll, _greedy = resp[0]
            whole = tok.encode(context + continuation, add_special_tokens=False)
            ctx = tok.encode(context, add_special_tokens=False)
            with torch.no_grad():
                ref = torch.log_softmax(hf_bundled(torch.tensor([whole])).logits[0].float(), -1)
            want = sum(float(ref[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
            assert float(got_ll) == pytest.approx(want, abs=TOL), (context, continuation)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in MC_DOCS)
    assert out["results"]["sluice_mc"]["acc,none"] >= 0  # scored end to end
    gens = [s["resps"][0][0] for s in out["samples"]["sluice_gen"]]
    assert len(gens) == len(GEN_DOCS) and all(isinstance(g, str) and "\n" not in g for g in gens)
    assert gens[0].strip() == "5"  # greedy: the model continues the count


def test_generate_until_with_local_chat_completions(server, offline):
    tasks = _write_tasks(offline)
    args = {
        "model": MODEL,
        "base_url": server.base_url + "/v1/chat/completions",
        "num_concurrent": 1,
        "max_retries": 1,
        "tokenizer_backend": None,
    }
    out = _evaluate("local-chat-completions", args, ["sluice_gen"], tasks, apply_chat_template=True)
    gens = [s["resps"][0][0] for s in out["samples"]["sluice_gen"]]
    assert len(gens) == len(GEN_DOCS) and all(isinstance(g, str) for g in gens)
    assert "exact_match,none" in out["results"]["sluice_gen"]
