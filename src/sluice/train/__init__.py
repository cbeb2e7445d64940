"""Training: fine-tune the models sluice serves on torch.distributed (docs/TRAINING.md).

A tower of its own beside serving: it may import `sluice.models` (loaders, tokenizer) and the
shared leaves; nothing in serving imports it. Its output enters serving only as files (an
exported Hugging Face folder registered as a fleet version).
"""
