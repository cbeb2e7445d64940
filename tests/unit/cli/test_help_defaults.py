"""The defaults `--help` names are the settings models' defaults (cli/setting_flags.py), so
the command line and the settings can never tell two stories; and every engine setting has its
flag, through the one mapping `serve` and `worker` share."""

from __future__ import annotations

import argparse
import re

import pytest
from pydantic import BaseModel

from sluice.cli import build_parser
from sluice.cli.common import ENGINE_FLAGS
from sluice.cli.setting_flags import shown_default
from sluice.config import Settings
from sluice.train.settings import TrainSettings

DEFAULT = re.compile(r"\(default: (.*)\)$")


def _subparser(path: list[str]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


def _flags(path: list[str]) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in _subparser(path)._actions if a.option_strings}


# flags whose --help names what an unset (None, "" or 0) setting stands for: not the field's value
DESCRIBED = {
    "--model",
    "--served-model-name",
    "--kv-cache-gib",
    "--kv-spill-dir",
    "--max-model-len",
    "--threads",
    "--decode-split-rows",
    "--lora-s3-endpoint",
    "--tp-size",
    "--rdzv-endpoint",
    "--s3-endpoint",
    "--lora-rank",
    "--lora-alpha",
    "--lora-targets",
    "--lighthouse",
    "--sync-every",
}

COMMANDS: list[tuple[list[str], type[BaseModel]]] = [
    (["serve"], Settings),
    (["worker"], Settings),
    (["train", "run"], TrainSettings),
]


@pytest.mark.parametrize(("path", "model"), COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_names_the_settings_defaults(path: list[str], model: type[BaseModel]) -> None:
    checked = 0
    for flag, action in _flags(path).items():
        if action.dest not in model.model_fields or flag in DESCRIBED:
            continue
        field = model.model_fields[action.dest]
        want = None if field.is_required() else shown_default(field.get_default(call_default_factory=True))
        said = DEFAULT.search(action.help or "")
        if isinstance(action, argparse._StoreConstAction) or want is None:
            assert said is None, f"{' '.join(path)} {flag}: --help names a default the settings do not have"
            continue
        assert said is not None, f"{' '.join(path)} {flag}: --help does not name its default ({want})"
        assert said.group(1) == want, f"{' '.join(path)} {flag}: --help says {said.group(1)}, the settings {want}"
        checked += 1
    assert checked >= 10  # the check ran over the flags (they set settings, by field name)


def test_described_defaults_are_of_unset_values() -> None:
    """A flag that describes its default in words does so for a setting left unset (None, ""
    or 0, resolved elsewhere), never in place of a value the settings hold."""
    for path, model in COMMANDS:
        for flag, action in _flags(path).items():
            if flag in DESCRIBED and action.dest in model.model_fields:
                assert model.model_fields[action.dest].default in (None, "", 0, "bundled"), flag
                assert DEFAULT.search(action.help or ""), flag


@pytest.mark.parametrize(
    ("value", "shown"),
    [(512, "512"), (0.0625, "0.0625"), (30.0, "30"), (2e-5, "2e-5"), (None, None), ("", None), ([], None)],
)
def test_a_default_is_shown_as_written(value: object, shown: str | None) -> None:
    assert shown_default(value) == shown


def test_every_engine_setting_has_its_flag() -> None:
    from sluice.engine.config import ENGINE_SETTINGS

    assert sorted(f.field for f in ENGINE_FLAGS) == sorted(ENGINE_SETTINGS)


def test_flags_given_override_and_flags_not_given_leave_the_setting_open() -> None:
    """A flag not given is None (the file, env or default decides); a switch given sets its value."""
    from sluice.cli.common import engine_setting_values

    parser = build_parser()
    assert set(engine_setting_values(parser.parse_args(["worker"])).values()) == {None}
    given = engine_setting_values(parser.parse_args(["worker", "--no-prefix-caching", "--kv-spill-gib", "0.5"]))
    assert given["enable_prefix_caching"] is False and given["kv_spill_gib"] == 0.5
    run = parser.parse_args(["train", "run", "--sync-checkpoint", "--lora-targets", "q, k"])
    assert run.async_checkpoint is False and run.lora_targets == ["q", "k"] and run.seq_len is None
