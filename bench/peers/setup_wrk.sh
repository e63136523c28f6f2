#!/usr/bin/env bash
# wrk, the compiled load generator of bench.peers' ", wrk" columns (one event-loop
# thread in C: it leaves the server the cores a Python client would take). Debian's
# package, installed if missing and if this shell may (root, apt-get). Never fails:
# without wrk the benchmark says so in its notes and leaves the wrk columns out.
# (oha, another compiled client, is only reported: bench.peers drives wrk's Lua script.)
set -uo pipefail
if command -v wrk >/dev/null; then
    echo "wrk ok: $(command -v wrk)"
    exit 0
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y wrk >&2 \
        || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y wrk >&2; }
fi
if command -v wrk >/dev/null; then
    echo "wrk ok: $(command -v wrk)"
elif command -v oha >/dev/null; then
    echo "wrk: not installed (oha is, at $(command -v oha), but bench.peers drives wrk);" \
        "the wrk columns will be skipped"
else
    echo "wrk: not installed (apt-get install -y wrk needs root and a Debian mirror);" \
        "the wrk columns will be skipped"
fi
exit 0
