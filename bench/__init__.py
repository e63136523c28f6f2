"""The benchmarks: a library plus thin commands, each run from the checkout's root.

``bench.lib`` holds what several benchmarks share: one server launcher
(``server``), one HTTP/1.1 load client framed by h11 (``http``) and the load
generators on it (``load``), process sampling (``procs``), in-process
onnxruntime references (``reference``), shared request bodies (``workloads``),
results JSON (``results``) and markdown tables (``report``). Each benchmark is
one module or package with a ``main`` that measures, writes its JSON under
``bench/out/`` and prints a report rendered from that JSON:

    .venv/bin/python -m bench.peers --smoke --model-dir DIR   # peers side by side
    .venv/bin/python -m bench.soak --seconds 60               # hostile clients, bounded
    .venv/bin/python -m bench.serving                         # the service against ORT
    .venv/bin/python -m bench.X --help                        # cache, cache_rss, floods,
        # graphs, grpc_lockout, int8, planner, pruning, settings, shape_churn,
        # starvation, transport, variants

docs/benchmarks.md says what each measures and what it found.
"""
