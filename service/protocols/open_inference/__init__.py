"""The Open Inference Protocol's own model, shared by its two transports.

KServe v2 is one protocol carried two ways: REST (``kserve_v2/``: JSON with
Triton's binary tensor extension, on FastAPI) and gRPC (``kserve_grpc/``:
protobuf messages, on grpc.aio). What a tensor means (the inputs a model takes,
datatypes and shapes, un-padding a ragged batch and re-padding its answer), how
the server describes itself and how an error names a field are the protocol's,
not a transport's: they live here once, so both transports answer the same
numbers and messages and neither imports the other. Framework-free: no FastAPI,
Starlette or grpc here (``[tool.importlinter]`` holds it).

- ``tensors``: input tensors <-> the engine's requests and results.
- ``padding``: padded rectangular batches <-> per-sequence arrays.
- ``metadata``: the server's name, version, platform and extensions.
- ``errors``: an engine error's message in the protocol's names.
"""
