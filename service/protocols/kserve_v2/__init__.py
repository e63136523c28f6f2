"""The Open Inference Protocol (KServe v2), with Triton's binary tensor extension."""
