"""Cold start: the GGUF reader, the gateway's torch-free tokenizer load, and the worker that
`sluice serve` starts before its own imports (prestarted, then adopted by the fleet).

No timing here (a busy machine makes any bound flaky): what is checked is what makes start-up
fast and still correct. The reader gives exactly what gguf's GGUFReader gives; the gateway never
imports torch; a prestarted worker is adopted (one worker, not two) and a failing one reports
as before. The figures are bench/serving/startup_memory.py's (docs/BENCHMARKS.md, "Start-up and memory").
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.errors import EngineUnavailableError, ModelLoadError
from sluice.models.bundled import default_model_path
from sluice.models.gguf.file import GgufFormatError, read_gguf
from sluice.models.gguf.metadata import open_gguf
from sluice.worker import spawn
from sluice.worker.grpc_client import GrpcEngineClient
from tests.server_process import start_server


def test_reader_equals_gguf_reader_on_the_bundled_file():
    from gguf import GGUFReader

    path = default_model_path()
    ours = read_gguf(path)
    ref = GGUFReader(str(path))
    expected = {}
    for key, field in ref.fields.items():
        try:
            expected[key] = field.contents()
        except Exception:  # what gguf_loader did with such a field: left it out
            continue
    assert list(ours.metadata) == list(expected)
    for key, value in expected.items():
        got = ours.metadata[key]
        assert got == value and type(got) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in got] == [type(v) for v in value], key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert (a.type_id, a.type_name, a.dims) == (b.tensor_type.value, b.tensor_type.name, tuple(b.shape.tolist()))
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert a.data.tobytes() == b.data.tobytes(), a.name  # the weights' bytes, untouched
        assert a.data.flags.writeable  # copy-on-write: torch.from_numpy takes it as it is


def test_reader_rejects_bad_files(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all" * 10)
    raw = default_model_path().read_bytes()
    header = tmp_path / "header.gguf"
    header.write_bytes(raw[:200_000])  # ends inside the vocabulary
    tensors = tmp_path / "tensors.gguf"
    tensors.write_bytes(raw[: len(raw) // 2])  # the header whole, half the weights
    for path, why in ((empty, "empty"), (garbage, "magic"), (header, "truncated"), (tensors, "past the end")):
        with pytest.raises(GgufFormatError, match=why):
            read_gguf(path)
        with pytest.raises(ModelLoadError, match="not a valid GGUF file"):
            open_gguf(path)


def test_gateway_imports_and_tokenizer_load_without_torch():
    code = (
        "import sys\n"
        "import sluice.api.serve_main, sluice.cli.serve\n"
        "from sluice.models.tokenizer_loader import load_tokenizer\n"
        "tok, cfg = load_tokenizer()\n"
        "assert tok.backend.encode('Hello world').ids and cfg.num_layers == 30\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'gguf' not in sys.modules, 'gguf imported'\n"
        # what the default path does not use stays out of memory (docs/BENCHMARKS.md "Serve
        # memory"): numpy ~15 MiB and llguidance ~8 MiB in the gateway; jinja2 loads on the
        # first chat render, so the worker, which shares these modules, never loads it
        "assert 'numpy' not in sys.modules, 'numpy imported'\n"
        "assert 'llguidance' not in sys.modules, 'llguidance imported'\n"
        "assert 'jinja2' not in sys.modules, 'jinja2 imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_prestarted_worker_is_adopted_once_and_reports_its_failure(tmp_path, capsys):
    missing = str(tmp_path / "no-such-model")
    args = ("--kv-cache-gib", "0.05")
    first = spawn.prestart_local_worker(missing, "float32", args)
    try:
        assert spawn.prestart_local_worker(missing, "float32", args) is first  # one per launch
        assert spawn.start_local_worker(missing, "float32", list(args)) is first  # adopted
        other = spawn.start_local_worker(missing, "float32", [*args, "--max-num-seqs", "4"])  # not the same launch
        assert other.pid != first.pid
        other.stop(grace_s=5)

        async def wait() -> None:
            client = GrpcEngineClient(first.address)
            try:
                await spawn.wait_ready(first, client, 120)
            finally:
                await client.close()

        with pytest.raises(EngineUnavailableError, match="exited with code 2") as err:
            asyncio.run(wait())
        assert "does not exist" in str(err.value)  # the same report as a worker started late
        assert "does not exist" in capsys.readouterr().err  # its output, held until adopted, shown
    finally:
        first.stop(grace_s=5)
        spawn.discard_prestarted(grace_s=5)


def test_discard_stops_a_prestarted_worker_nobody_adopted(tmp_path, capsys):
    worker = spawn.prestart_local_worker(str(tmp_path / "no-such-model"), "float32", ("--max-num-seqs", "3"))
    assert worker.process.wait(120) == 2  # it failed (the model is missing) ...
    spawn.discard_prestarted(grace_s=10)
    assert "does not exist" not in capsys.readouterr().err  # ... silently: the gateway reports it, once
    assert "does not exist" in worker.stderr_tail()
    assert worker.process.poll() is not None
    assert not os.path.exists(worker.socket_dir)
    assert not spawn._prestarted  # nothing left to adopt


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_serve_adopts_the_worker_it_prestarted(tiny_llama_dir):
    server = start_server(["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    try:
        kids = _children(server.process.pid)
        assert len(kids) == 1, f"one worker, the prestarted one; got {kids}"
        assert f"adopted the engine worker started before the gateway's imports (pid {kids[0]})" in server.log()
    finally:
        assert server.stop() == 0
