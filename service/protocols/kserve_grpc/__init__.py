"""The Open Inference Protocol over gRPC (``GRPCInferenceService``, Triton's and KServe's).

Generated stubs come from ``tritonclient[grpc]``; this folder only translates
messages to the engine's requests (``codec.py``), errors to status codes
(``errors.py``), and runs ``grpc.aio`` beside the HTTP server (``server.py``).
"""
