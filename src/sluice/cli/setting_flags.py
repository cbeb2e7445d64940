"""Flags that set the fields of a settings model (the server's Settings, TrainSettings).

A flag says only what the command line alone knows (its metavar, a flag name not its field's, a
switch); its help text is the field's description (its docstring), and its type, its choices
and the default its --help names are read from the field too, so no help text restates a
setting or its default by hand and none can drift from the model's. A description that ends in
"(default: ...)" names what an unset value stands for itself. Such a flag defaults to None,
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
    metavar: str | None = None
    flag: str | None = None  # a flag not named after its field: --ping-interval sets ping_interval_s
    # a flag without a value: given, the field takes this value (False: "turn off: " the description)
    switch: bool | None = None
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


NAMED_DEFAULT = re.compile(r"\(default: [^()]*\)$")


def flag_help(flag: SettingFlag, field: FieldInfo) -> str:
    """The flag's --help: the field's description, on one line, and the field's default where
    the description does not name one itself (nothing for a switch or a required field)."""
    described = " ".join((field.description or "").split())
    if flag.switch is False:
        described = "turn off: " + described
    if flag.switch is not None or field.is_required() or NAMED_DEFAULT.search(described):
        return described
    shown = shown_default(field.get_default(call_default_factory=True))
    return described if shown is None else f"{described} (default: {shown})"


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
        p.add_argument(flag.option, help=flag_help(flag, field).replace("%", "%%"), **kwargs)


def setting_values(args: argparse.Namespace, flags: Iterable[SettingFlag]) -> dict[str, Any]:
    """The flags' values by field name; None = not given (the file, env or default decides)."""
    return {flag.field: getattr(args, flag.field) for flag in flags}
