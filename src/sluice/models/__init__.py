"""Model definitions, weight loaders, tokenizer and sampling (no policy, no scheduling)."""
