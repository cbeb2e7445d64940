"""Safety layers: L1 input rules, L2 classifier, L3 streaming guard, L4 post-check.

The serving layer uses `SafetyPipeline` (pipeline.py); everything else is its parts."""
