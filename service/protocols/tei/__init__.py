"""Hugging Face text-embeddings-inference (TEI) compatible API: the fifth protocol.

``huggingface_hub.InferenceClient`` (and Haystack on it) posts to ``/``, LlamaIndex
to ``/embed``, LangChain's ``HuggingFaceEndpointEmbeddings`` through
huggingface_hub; TEI's shapes and statuses, on the same engine and request scope.
"""
