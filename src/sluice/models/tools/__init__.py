"""Tool use below the wire formats: tool specs, the per-family prompt format, the grammar a
tool_choice implies, and a streaming parser from generated text to typed tool-call pieces."""
