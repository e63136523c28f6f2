"""Wire protocols on top of the engine, one folder each (schemas, codec, routes, errors).

``wire`` and ``http`` hold what every protocol shares: JSON and float32 bytes,
and the HTTP plumbing (engine dependency, API key, body reading, disconnects,
per-protocol error rendering).
"""
