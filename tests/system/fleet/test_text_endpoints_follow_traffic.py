"""The endpoints that tokenize without generating (`/v1/messages/count_tokens`, `/tokenize`,
`/detokenize`) use the version generation uses, by the live weights, not the fleet file's
`traffic`: one real `sluice serve` whose model has two versions with different tokenizers (the
bundled SmolLM2, and a tiny byte-level model: one token per byte, a 512-token window). The file
gives all traffic to the first; a rollout moves it to the second and retires the first, and
every endpoint follows it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import tokenizers

from tests.fleet_process import ADMIN, admin, ask, local_version, rollout_of, status, wait_until, warm_workers
from tests.server_process import MODEL, Proc, start_server
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.slow
TEXT = "Hello world"
IDS = [40, 41, 42, 43]  # decoded by whichever version answers


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text-endpoints")
    tiny = write_tiny_model(tmp / "tiny", "llama")
    tiny_version = local_version(MODEL, "v2", 0).replace('weights = "bundled"', f'weights = "{tiny}"')
    path = tmp / "fleet.toml"
    path.write_text(local_version(MODEL, "v1", 100) + tiny_version)
    proc = start_server(["--fleet", str(path)], env={"SLUICE_ADMIN_KEY": ADMIN})
    proc.extra["tiny"] = tiny
    wait_until(lambda: warm_workers(proc, version="v1"), "the first version's worker")
    yield proc
    proc.stop()


def text_answers(proc: Proc) -> dict:
    """What the three endpoints answer for the model now."""
    post = lambda path, body: httpx.post(proc.base_url + path, json={"model": MODEL, **body}, timeout=60)  # noqa: E731
    tok = post("/tokenize", {"prompt": TEXT}).json()
    counted = post("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": TEXT}]}).json()
    detok = post("/detokenize", {"tokens": IDS}).json()
    return {
        "count": tok["count"],
        "window": tok["max_model_len"],
        "input_tokens": counted["input_tokens"],
        "text": detok["prompt"],
    }


def generated_by(proc: Proc) -> str:
    r = ask(proc, None, "some-user")
    assert r.status_code == 200, r.text
    return r.headers["sluice-model-version"].rpartition("/")[2]


def test_count_tokenize_and_detokenize_follow_a_rollout(server):
    tiny = tokenizers.Tokenizer.from_file(str(Path(server.extra["tiny"]) / "tokenizer.json"))
    before = text_answers(server)
    assert generated_by(server) == "v1"
    assert before["count"] == 2 and before["text"] != tiny.decode(IDS, skip_special_tokens=False)

    plan = {
        "to": "v2",
        "steps": [100],
        "step_interval_s": 1,
        "min_requests": 1,
        "max_error_rate": 1,
        "max_ttft_p95_s": 600,
        "warm_timeout_s": 600,
        "drain_timeout_s": 60,
    }
    r = admin(server, "POST", f"/admin/fleet/models/{MODEL}/rollout", plan)
    assert r.status_code == 200, r.text
    wait_until(lambda: rollout_of(server)["phase"] == "done", "the rollout to finish")
    versions = status(server)["models"][MODEL]["versions"]
    assert versions["v1"]["state"] == "retired" and versions["v2"]["share"] == 100.0

    # the file still gives v1 all the traffic; generation and the three endpoints use v2
    assert generated_by(server) == "v2"
    after = text_answers(server)
    chat = f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"  # the tiny model's (ChatML) prompt
    assert after == {
        "count": len(TEXT.encode()),
        "window": 512,
        "input_tokens": len(tiny.encode(chat).ids),
        "text": tiny.decode(IDS, skip_special_tokens=False),
    }
