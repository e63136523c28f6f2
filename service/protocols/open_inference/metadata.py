"""What the server says of itself over both transports (server and model metadata)."""

from __future__ import annotations

from service.version import VERSION

SERVER_NAME = "attnserve"
SERVER_VERSION = VERSION
PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
