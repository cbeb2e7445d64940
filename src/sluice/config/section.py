"""The base of the server's settings sections: a field's docstring is its description, the one
text that says what the setting is (`sluice serve --help` shows it: cli/setting_flags.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)
