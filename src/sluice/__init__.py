"""sluice: a self-hosted LLM inference platform (see docs/ and DESIGN)."""

__version__ = "0.1.0"
