"""Build a multi-head self-attention encoder in PyTorch and export it to validated ONNX.

Kept import-light on purpose: :mod:`model_export.graph_io` and
:mod:`model_export.config` are used by the torch-free service, so this
package must not import torch at the top level.
"""
