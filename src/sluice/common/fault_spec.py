"""The parser of the testing aids' fault specs: a worker's `--fault-injection` /
SLUICE_FAULT_INJECTION (worker/faults.py) and training's SLUICE_TRAIN_FAULT (train/faults.py).

A spec is a comma-separated list of items; an item is a fault's name and its arguments, joined by
the system's separator: `name=value` for the worker (`fail_seed=7,fail_all`), `kind:a:b` for
training (`kill:1:6,delay:0.3`). Each system declares its faults (`FaultKind`: the name, one
converter per argument, how many trailing ones may be left out, the usage shown) in a
`FaultGrammar`, and folds the parsed items into its own typed faults. A bad item is a ValueError
naming it and listing every fault the spec may hold.

Parsing happens once, where a process starts: nothing here runs on a request or a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    usage: str  # as the error lists it: "fail_seed=N", "kill:RANK:STEP[:GROUP]"
    args: tuple[Callable[[str], Any], ...] = ()  # one converter per argument; () = a flag
    optional: int = 0  # how many trailing arguments may be left out


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    args: tuple[Any, ...]  # converted; () for a flag


@dataclass(frozen=True, slots=True)
class FaultGrammar:
    source: str  # what the spec is called in errors: "fault injection", "SLUICE_TRAIN_FAULT"
    separator: str  # between an item's name and its arguments (and between arguments)
    kinds: tuple[FaultKind, ...]

    def parse(self, spec: str | None) -> list[Fault]:
        """The items of `spec` in order (None or "" → none). Raises ValueError naming a bad item."""
        found = []
        for item in (spec or "").split(","):
            item = item.strip()
            if item:
                found.append(self._item(item))
        return found

    def _item(self, item: str) -> Fault:
        name, *raw = item.split(self.separator)
        kind = next((k for k in self.kinds if k.name == name), None)
        if kind is not None and len(kind.args) - kind.optional <= len(raw) <= len(kind.args):
            try:
                return Fault(name, tuple(convert(value) for convert, value in zip(kind.args, raw)))
            except ValueError:
                pass
        raise ValueError(f"{self.source}: {item!r} is not one of {', '.join(k.usage for k in self.kinds)}")
