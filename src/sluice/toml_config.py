"""A TOML settings file → a validated pydantic model, or every problem as `FILE:LINE: field: what`.

The fleet file, search.toml and train.toml are read the same way: the text is parsed by tomllib,
validated by the file's pydantic model, and every problem is reported at once in file order with
the line it is on (toml_lines.py finds the lines tomllib does not give). The reading, pydantic's
error translation and the report's format live here once, so the three files' messages read alike.
Each file keeps its own checks that need the whole document (`cross_check` in each loader).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sluice.toml_lines import KeyPath, key_lines, line_of

Problem = tuple[KeyPath, str]
ErrorFactory = Callable[[list[str]], Exception]  # FleetFileError, SearchConfigError, TrainConfigError
M = TypeVar("M", bound=BaseModel)

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def read_text(path: str | Path, what: str, error: ErrorFactory) -> tuple[str, Path]:
    """The file's text and its expanded path; an unreadable file is `error` naming it and `what` it is."""
    p = Path(path).expanduser()
    try:
        return p.read_text(), p
    except OSError as exc:
        raise error([f"{p}: cannot read the {what} ({exc.strerror or exc})"]) from None


def parse_toml(text: str, source: str, error: ErrorFactory) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """The parsed document and the line of each of its keys."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error([f"{source}: not valid TOML: {exc}"]) from None
    return data, key_lines(text)


def pydantic_problems(
    exc: ValidationError, *, unknown_field: str | None = None, fix_loc: Callable[[list[str | int]], None] | None = None
) -> list[Problem]:
    """pydantic's errors as (field path, message): its "Value error, " prefix dropped, a missing
    field said plainly, a bad table name (pydantic's "[key]" marker) named as such; `unknown_field`
    replaces the message for a field the model does not have; `fix_loc` edits a path in place
    (e.g. drops a tagged union's branch, which is not a key of the file)."""
    out: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        if fix_loc is not None:
            fix_loc(loc)
        msg = err["msg"].removeprefix("Value error, ")
        if "[key]" in loc:
            loc.remove("[key]")
            msg = f"invalid name: {msg}"
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden" and unknown_field is not None:
            msg = unknown_field
        out.append((tuple(loc), msg))
    return out


def dotted_path(loc: Sequence[str | int]) -> str:
    """A field path as the file spells it: `models.smol.versions.v2.traffic`, `shards[1].values`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = part if part and set(part) <= _BARE else '"' + part.replace('"', '\\"') + '"'
            out += ("." if out else "") + key
    return out or "(top level)"


def report(source: str, lines: dict[KeyPath, int], found: Sequence[Problem]) -> list[str]:
    """One line per problem, in file order (problems without a line last)."""
    located = [(line_of(lines, loc), loc, msg) for loc, msg in found]
    located.sort(key=lambda t: (t[0] is None, t[0] or 0))
    return [
        f"{source}:{line}: {dotted_path(loc)}: {msg}" if line is not None else f"{source}: {dotted_path(loc)}: {msg}"
        for line, loc, msg in located
    ]


def validate(
    model: type[M],
    data: dict[str, Any],
    *,
    source: str,
    lines: dict[KeyPath, int],
    error: ErrorFactory,
    context: dict[str, Any] | None = None,
    fix_loc: Callable[[list[str | int]], None] | None = None,
) -> M:
    """`data` as a `model`, or `error` listing every problem at its line."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(report(source, lines, pydantic_problems(exc, fix_loc=fix_loc))) from None
