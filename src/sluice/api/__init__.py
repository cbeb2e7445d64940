"""The HTTP surface: Anthropic Messages, OpenAI chat completions, SSE, error mapping."""
