-- wrk's script for bench.peers: POSTs a pre-built list of bodies in turn (each connection
-- thread from its own place), then prints one line of JSON for bench/peers/wrk.py.
--   wrk -t1 -c32 -d4s --latency -H 'Content-Type: application/json' \
--       -s wrk_bodies.lua http://127.0.0.1:PORT/v1/embeddings -- BODIES_FILE
-- BODIES_FILE holds, per body, its length in bytes on a line, then the bytes.
local bodies, count, turn = {}, 0, 0

function init(args)
  local file = assert(io.open(args[1], "rb"))
  while true do
    local line = file:read("*l")
    if not line then break end
    count = count + 1
    bodies[count] = file:read(tonumber(line))
  end
  file:close()
  assert(count > 0, "no bodies in " .. args[1])
  turn = tonumber(args[2] or "0") or 0
end

function request()
  turn = turn % count + 1
  return wrk.format("POST", nil, nil, bodies[turn])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK-JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %.0f, "p99": %.0f, "mean": %.1f, "max": %.0f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
