"""Per-step fault tolerance: replica groups, each its own torchrun, joined step by step through
torchft's quorum (a Lighthouse), with live recovery from a peer."""
