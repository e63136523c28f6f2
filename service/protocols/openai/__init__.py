"""The OpenAI embeddings API (``POST /v1/embeddings``) on the engine."""
