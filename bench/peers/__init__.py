"""Peers side by side: this service against PyTriton, infinity-emb, sentence-transformers.

Every contender runs in its own process (servers on 127.0.0.1, all started
once and idle while another is measured; in-process contenders in a worker
process of their own venv); per round and workload they run one after the
other, the order rotated each round, on the same inputs. The machine is shared and noisy
(2 cores), so each number is a ratio to onnxruntime called in-process on our
own graph in the same round (the limit); tables give the median and the
min–max over rounds. Before it is timed, every contender's answer is checked
against in-process onnxruntime on our graph (max abs difference ≤ 1e-4, of
per-token embeddings and attention, or of sentence embeddings for text).

The load generator is one process with the load client of ``bench.lib``
(keep-alive HTTP/1.1 framed by h11; an httpx client would eat the cores it
measures); every loop is bounded by count and time. Where ``wrk`` is installed
(``setup_wrk.sh``) it drives the servers too on W2, W4 and T2 (rows ``…, wrk``):
a compiled client, which leaves the server the cores the Python one takes; it
reads no answer, so its rounds count after the Python client's check. Peers live in venvs made by
``bench/peers/setup_*.sh``; a contender whose venv is missing is skipped with a
line saying so. Measuring writes ``bench/out/peers.json``; the report in
docs/benchmarks.md and the plot are rendered from that file (``--from-json``
renders an earlier run's again).

    .venv/bin/python -m bench.peers --rounds 3          # writes docs/
    .venv/bin/python -m bench.peers --smoke --model-dir DIR   # ours only, < 30 s

The package: ``workloads`` (inputs), ``wire`` (requests and answers of each
protocol), ``checks`` (answers against the reference), ``contenders/`` (one
module each: ours, in-process, PyTriton, infinity-emb), ``wrk`` (the compiled
load client), ``measure`` (rounds),
``ratios``, ``report`` and ``plot`` (rendering), ``cli``; ``workers/`` holds
what runs inside the peers' own venvs.
"""
