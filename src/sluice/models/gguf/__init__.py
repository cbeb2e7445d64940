"""GGUF files: the header and tensor index over a mapped file, the metadata, the tokenizer, the weights."""
