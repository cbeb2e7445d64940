"""LoRA over the worker protocol, against a real `sluice worker` (tiny random llama) and adapters
PEFT made: a request names its adapter and gets what the in-process engine gives; LoadAdapter
checks and loads ahead (a damaged adapter is INVALID_ARGUMENT naming the problem, the worker
unharmed); UnloadAdapter drops it and the next request reloads it; an s3:// adapter is fetched
from a real S3-compatible server (moto)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import AdapterError
from sluice.models.loader import load_model
from sluice.types import AdapterRef, GenerationRequest, SamplingParams
from sluice.worker.grpc_client import GrpcEngineClient
from tests.lora_adapters import peft_adapter
from tests.s3_server import AWS_ENV, moto_server
from tests.server_process import free_port, start_worker

PROMPT = [3 + (11 * j) % 250 for j in range(15)]


@pytest.fixture(scope="module")
def adapter(tiny_llama_dir, tmp_path_factory):
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype="float32")
    return peft_adapter(hf, tmp_path_factory.mktemp("lora") / "a1", rank=8, seed=5, std=0.2)


def _req(rid: str, adapter: AdapterRef | None) -> GenerationRequest:
    return GenerationRequest(
        rid, PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), adapter=adapter
    )


async def _ready(client: GrpcEngineClient) -> None:
    for _ in range(1200):  # the model loads after the worker listens (a generous bound)
        if await client.ready():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the worker never became ready")


async def _tokens(client, req: GenerationRequest) -> list[int]:
    return [t async for ev in client.generate(req) for t in ev.token_ids]


def test_adapters_over_the_worker_protocol(tiny_llama_dir, adapter, tmp_path):
    ref = AdapterRef("a1", str(adapter))
    local = LLMEngine(load_model(tiny_llama_dir, progress=False), EngineConfig(num_kv_blocks=64))
    want = local.generate([_req("x", ref)])["x"].token_ids
    base = local.generate([_req("y", None)])["y"].token_ids
    assert want != base
    bad = tmp_path / "bad"
    shutil.copytree(adapter, bad)
    (bad / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00")
    address = f"127.0.0.1:{free_port()}"
    worker = start_worker(address, ["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    try:

        async def run():
            client = GrpcEngineClient(address)
            try:
                await _ready(client)
                first = await client.load_adapter(ref)
                assert first.bytes > 0 and first.load_s > 0
                assert (await client.load_adapter(ref)).load_s == 0, "resident already"
                with pytest.raises(AdapterError, match="not a readable safetensors file"):
                    await client.load_adapter(AdapterRef("bad", str(bad)))
                with pytest.raises(AdapterError, match="not a readable safetensors file"):
                    await _tokens(client, _req("bad-req", AdapterRef("bad", str(bad))))
                assert await _tokens(client, _req("a", ref)) == want
                assert await _tokens(client, _req("b", None)) == base
                stats = await client.stats()
                assert (
                    stats.lora_resident == ["a1"] and stats.max_loras == 8 and stats.lora_resident_bytes == first.bytes
                )
                assert await client.unload_adapter("a1") == 1
                assert (await client.stats()).lora_resident == []
                assert await _tokens(client, _req("c", ref)) == want, "reloaded on demand"
                assert (await client.stats()).lora_loads == 2
            finally:
                await client.close()

        asyncio.run(run())
    finally:
        assert worker.stop() == 0


def test_an_s3_adapter_is_fetched_from_object_storage(tiny_llama_dir, adapter, tmp_path, monkeypatch):
    import boto3

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    local = LLMEngine(load_model(tiny_llama_dir, progress=False), EngineConfig(num_kv_blocks=64))
    want = local.generate([_req("x", AdapterRef("a1", str(adapter)))])["x"].token_ids
    with moto_server(tmp_path) as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="adapters")
        for f in adapter.iterdir():
            s3.upload_file(str(f), "adapters", f"support/v1/{f.name}")
        address = f"127.0.0.1:{free_port()}"
        worker = start_worker(
            address, ["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05", "--lora-s3-endpoint", endpoint]
        )
        try:

            async def run():
                client = GrpcEngineClient(address)
                try:
                    await _ready(client)
                    ref = AdapterRef("support", "s3://adapters/support/v1")
                    assert await _tokens(client, _req("s3", ref)) == want
                    with pytest.raises(AdapterError, match="no such object"):
                        await client.load_adapter(AdapterRef("gone", "s3://adapters/nothing/here"))
                finally:
                    await client.close()

            asyncio.run(run())
        finally:
            assert worker.stop() == 0
