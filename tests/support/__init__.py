"""What the tests share, one module per concern: the tiny model's sizes (``tiny``),
inputs (``inputs``), direct onnxruntime runs (``onnx_runs``), reading metrics
(``metrics``) and waiting for a condition (``wait``).

Nothing here imports ``service``: expectations come from the ONNX files and numpy,
and a server is observed from outside (its HTTP answers and ``/metrics``).
"""
