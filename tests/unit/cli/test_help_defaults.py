"""A setting's flag says what its field says (cli/setting_flags.py): its --help is the field's
description and the default it names is the field's, so the command line and the settings can
never tell two stories; and every engine setting has its flag, through the one mapping `serve`
and `worker` share."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest
from pydantic import BaseModel

from sluice.cli import build_parser
from sluice.cli.common import ENGINE_FLAGS, KERNEL_FLAGS, MODEL_FLAGS
from sluice.cli.serve import SETTING_FLAGS
from sluice.cli.setting_flags import NAMED_DEFAULT, SettingFlag, shown_default
from sluice.cli.train import RUN_FLAGS
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


COMMANDS: list[tuple[list[str], type[BaseModel]]] = [
    (["serve"], Settings),
    (["worker"], Settings),
    (["train", "run"], TrainSettings),
]


# each command's flags that set a setting, and the settings model they set
SETTING_COMMANDS: list[tuple[list[str], type[BaseModel], tuple[SettingFlag, ...]]] = [
    (["serve"], Settings, (*SETTING_FLAGS, *ENGINE_FLAGS)),
    (["worker"], Settings, (*MODEL_FLAGS, *ENGINE_FLAGS)),
    (["generate"], Settings, (*MODEL_FLAGS, *KERNEL_FLAGS)),
    (["train", "run"], TrainSettings, RUN_FLAGS),
]


def _shown_help(path: list[str], action: argparse.Action) -> str:
    """The help text as --help prints it (% escapes expanded), on one line."""
    return " ".join(_subparser(path)._get_formatter()._expand_help(action).split())


@pytest.mark.parametrize(
    ("path", "model", "flags"), SETTING_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_every_flags_help_is_its_fields_description(
    path: list[str], model: type[BaseModel], flags: tuple[SettingFlag, ...]
) -> None:
    """Nothing but the field's description (and the default the field holds, or "turn off: "
    for a switch that sets False): the help is never written a second time in the CLI."""
    actions = _flags(path)
    for flag in flags:
        description = " ".join((model.model_fields[flag.field].description or "").split())
        assert description, f"{model.__name__}.{flag.field} has no description (its docstring)"
        shown = _shown_help(path, actions[flag.option])
        if flag.switch is False:
            description = "turn off: " + description
        rest = shown.removeprefix(description)
        assert rest != shown, f"{' '.join(path)} {flag.option}: {shown!r} is not the field's {description!r}"
        assert rest == "" or DEFAULT.fullmatch(rest.lstrip()), f"{flag.option}: {rest!r} follows the description"


@pytest.mark.parametrize(("path", "model"), COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_names_the_settings_defaults(path: list[str], model: type[BaseModel]) -> None:
    checked = 0
    for flag, action in _flags(path).items():
        if action.dest not in model.model_fields or flag == "--fault-injection":  # worker's own (faults.py)
            continue
        field = model.model_fields[action.dest]
        if NAMED_DEFAULT.search(" ".join((field.description or "").split())):
            continue  # the description names what an unset value stands for (the next test)
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
    """A description that names its default in words does so for a setting left unset (None, ""
    or 0, resolved elsewhere), never in place of a value the settings hold."""
    described = 0
    for model in (Settings, TrainSettings):
        for name, field in model.model_fields.items():
            if NAMED_DEFAULT.search(" ".join((field.description or "").split())):
                assert field.default in (None, "", 0), f"{model.__name__}.{name}"
                described += 1
    assert described >= 15


def test_defaults_resolved_elsewhere_are_named_as_resolved() -> None:
    """Where 0 stands for another module's constant, the description names that constant's value."""
    from sluice.train.parallel.dims import DEFAULT_TP_SIZE
    from sluice.train.replica.sync import DEFAULT_SYNC_EVERY

    fields = TrainSettings.model_fields
    assert f"(default: {DEFAULT_TP_SIZE})" in (fields["tp_size"].description or "")
    assert f"(default: {DEFAULT_SYNC_EVERY})" in (fields["sync_every"].description or "")
    # the server's engine settings left unset take EngineConfig's defaults
    from sluice.engine.config import EngineConfig

    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert f"(default: {engine['threads']})" in (Settings.model_fields["threads"].description or "")
    assert f"(default: {engine['decode_split_rows']}," in (Settings.model_fields["decode_split_rows"].description or "")


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
