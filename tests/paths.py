"""Where things are, for tests at any depth of tests/."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
DATA = ROOT / "tests" / "data"
