"""See the package docstring of sluice.train."""
