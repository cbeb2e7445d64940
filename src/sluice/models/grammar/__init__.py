"""Grammar-constrained decoding: GuidedDecoding specs → compiled grammars → per-row token masks."""
