"""The stages one generation's events pass through after the engine, each an async generator
the pipeline chains with `contextlib.aclosing`: the safety guard (L2–L4, guarded_stream.py),
tool-call parsing (tool_stream.py), logprobs held with their text (logprob_feed.py), the
stream's deadline (deadline.py), and the look-ahead that opens a stream only once its first
outcome is known (lookahead.py)."""
