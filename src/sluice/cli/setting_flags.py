"""Flags that set the fields of a settings model (the server's Settings, TrainSettings).

A flag says once what only the command line knows (its help text, its metavar); its type, its
choices and the default its --help names are read from the model's field, so no help text
restates a default by hand and none can drift from the model's. Such a flag defaults to None,
"not given": the settings file, the environment or the field's default decides, and a flag
given overrides them (`setting_values` hands the given ones on by field name).
"""

from __future__ import annotations

import argparse
import enum
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ArgParser = argparse.ArgumentParser | argparse._ArgumentGroup


@dataclass(frozen=True, slots=True)
class SettingFlag:
    field: str  # the setting; its flag is --FIELD with dashes for underscores unless `flag` names it
    help: str = ""
    metavar: str | None = None
    # how --help names the default where the field's value does not say it: what None or ""
    # stands for ("the model's"), or the value a 0 is resolved to elsewhere
    default: str | None = None
    flag: str | None = None  # a flag not named after its field: --ping-interval sets ping_interval_s
    switch: bool | None = None  # a flag without a value: given, the field takes this value
    parse: Callable[[str], Any] | None = None  # a value that is not one word of the field's type
    nargs: str | None = None

    @property
    def option(self) -> str:
        return self.flag or "--" + self.field.replace("_", "-")


def shown_default(value: object) -> str | None:
    """A field's default as --help names it: 512, 0.0625, 2e-5, ddp; None for no value."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or value == "" or isinstance(value, list | dict):
        return None
    if isinstance(value, float):  # 30 (not 30.0), 0.0625, 2e-5 (not 2e-05)
        return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:g}")
    return str(value)


def flag_default(flag: SettingFlag, field: FieldInfo) -> str | None:
    """What the flag's --help says its default is; None: it says nothing (a switch, a required
    field, a field with nothing to show)."""
    if flag.switch is not None:
        return None
    if flag.default is not None:
        return flag.default
    return None if field.is_required() else shown_default(field.get_default(call_default_factory=True))


def _value_kwargs(annotation: Any) -> dict[str, Any]:
    """argparse's type or choices for one value of a field: its Literal's or enum's words, int
    or float; a str (or anything else) stays the string given."""
    if get_origin(annotation) in (Union, types.UnionType):  # X | None: the flag gives an X
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return {"choices": list(get_args(annotation))}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"choices": [member.value for member in annotation]}
    if annotation in (int, float):
        return {"type": annotation}
    return {}


def add_setting_flags(
    p: ArgParser, model: type[BaseModel], flags: Iterable[SettingFlag], *, model_defaults: bool = False
) -> None:
    """Add `flags`, which set fields of `model`. model_defaults: the parser's default is the
    field's own, for a command that reads no settings file (`sluice worker`'s --dtype)."""
    for flag in flags:
        field = model.model_fields[flag.field]
        kwargs: dict[str, Any] = {"dest": flag.field, "default": None}
        if model_defaults and not field.is_required():
            kwargs["default"] = field.get_default(call_default_factory=True)
        if flag.switch is not None:
            kwargs.update(action="store_const", const=flag.switch)
        else:
            kwargs.update(_value_kwargs(field.annotation), metavar=flag.metavar, nargs=flag.nargs)
            if flag.parse is not None:
                kwargs["type"] = flag.parse
        shown = flag_default(flag, field)
        help_text = flag.help if shown is None else f"{flag.help} (default: {shown})".lstrip()
        p.add_argument(flag.option, help=help_text, **kwargs)


def setting_values(args: argparse.Namespace, flags: Iterable[SettingFlag]) -> dict[str, Any]:
    """The flags' values by field name; None = not given (the file, env or default decides)."""
    return {flag.field: getattr(args, flag.field) for flag in flags}
