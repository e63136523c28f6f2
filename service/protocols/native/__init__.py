"""The native API: /v1/encode, /v1/tokenize, /v1/models, health and metrics."""
