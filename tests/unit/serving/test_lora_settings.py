"""The LoRA settings: `--lora-modules NAME=PATH` and its settings / environment equivalents
(SLUICE_LORA_MODULES as a JSON list), checked at start-up, and the limits reaching EngineConfig
(so every worker `sluice serve` starts gets them)."""

from __future__ import annotations

import pytest

from sluice.config import SettingsError, load_settings
from sluice.config.lora import parse_lora_module
from sluice.engine.config import EngineConfig


def test_lora_modules_from_flags_file_and_environment(tmp_path, monkeypatch):
    assert load_settings(None, lora_modules=["a=/x", "b=s3://bucket/b"]).lora_modules == ["a=/x", "b=s3://bucket/b"]
    f = tmp_path / "s.toml"
    f.write_text('lora_modules = ["support=/adapters/support"]\nmax_loras = 4\n')
    s = load_settings(f)
    assert s.lora_modules == ["support=/adapters/support"] and s.max_loras == 4
    monkeypatch.setenv("SLUICE_LORA_MODULES", '["env=/adapters/env"]')
    monkeypatch.setenv("SLUICE_MAX_CPU_LORAS", "32")
    s = load_settings(None)
    assert s.lora_modules == ["env=/adapters/env"]
    config = EngineConfig.from_settings(s)
    assert (config.max_loras, config.max_cpu_loras, config.max_lora_rank) == (8, 32, 64)


@pytest.mark.parametrize(
    "modules, why",
    [
        (["noequals"], "expected NAME=PATH"),
        (["a="], "expected NAME=PATH"),
        (["bad name=/x"], "the name must be"),
        (["a=/x", "a=/y"], "given twice"),
    ],
)
def test_bad_lora_modules_stop_start_up(modules, why):
    with pytest.raises(SettingsError, match=why):
        load_settings(None, lora_modules=modules)


def test_limits_are_checked():
    with pytest.raises(SettingsError, match="max_loras"):
        load_settings(None, max_loras=-1)
    with pytest.raises(ValueError, match="max_cpu_loras must be >= max_loras"):
        EngineConfig(max_loras=8, max_cpu_loras=4)
    assert parse_lora_module(" s = s3://b/p ") == ("s", "s3://b/p")
