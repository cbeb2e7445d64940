"""The warm pool's size by time of day: `[(start "HH:MM", size), …]` in one timezone.

Each window runs from its start until the next window's start; the last one runs past midnight
into the first, so a schedule of one window is a constant size. Times are local wall-clock times
in `timezone` (an IANA name), because load follows the users' day: across a daylight-saving
change the windows move with the clock, as a KEDA cron trigger with the same timezone does.
"""

from __future__ import annotations

import re
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class WarmPoolWindow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str  # "HH:MM", 24-hour local time
    size: int = Field(ge=0)  # pre-loaded idle workers kept from `start` on

    @field_validator("start")
    @classmethod
    def _hh_mm(cls, v: str) -> str:
        if not _HHMM.match(v):
            raise ValueError(f"start {v!r} is not HH:MM (24-hour, e.g. 08:30)")
        return v

    @property
    def start_time(self) -> time:
        hh, mm = self.start.split(":")
        return time(int(hh), int(mm))


class WarmPoolSchedule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    timezone: str = "UTC"
    windows: tuple[WarmPoolWindow, ...] = (WarmPoolWindow(start="00:00", size=1),)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r} (an IANA name such as Europe/Berlin)") from None
        return v

    @model_validator(mode="after")
    def _ordered(self) -> WarmPoolSchedule:
        if not self.windows:
            raise ValueError("windows: at least one (start, size) window")
        starts = [w.start for w in self.windows]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError(f"windows: starts must be strictly increasing, got {starts}")
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def window_at(self, when: datetime) -> WarmPoolWindow:
        """The window in force at `when` (an aware datetime; naive ones are refused)."""
        if when.tzinfo is None:
            raise ValueError("window_at needs an aware datetime (a naive one has no timezone)")
        local = when.astimezone(self.zone).time()
        current = self.windows[-1]  # before the first start of the day: yesterday's last window
        for w in self.windows:
            if w.start_time <= local:
                current = w
        return current

    def size_at(self, when: datetime) -> int:
        return self.window_at(when).size

    @property
    def smallest(self) -> int:
        return min(w.size for w in self.windows)
