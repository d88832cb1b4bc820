"""The OpenAI-compatible HTTP server over the batcher."""
