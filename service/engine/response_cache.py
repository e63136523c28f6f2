"""Answers kept for requests that come again (re-indexing, repeated queries), in bytes.

The key is what decides an answer: the exact loaded model (a swap or reload makes
new keys, and drops the old model's entries), the sequences the graph is fed (so
texts that tokenize alike share), every resolved option, what the protocol's wire
costs (its size limit was checked against it) and, when the server has API keys,
the caller's key (answers are never shared across keys). Entries are
:class:`EncodeResult` objects, read-only numpy arrays, evicted least recently
used past ``ATTNSERVE_RESPONSE_CACHE_BYTES``. Identical requests in flight at the
same time run once: the later ones wait for the first's answer (and run
themselves if it fails).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

import numpy as np

from service.engine.types import EncodeResult
from service.metrics import Metrics


def _arrays(result: EncodeResult) -> Iterator[np.ndarray]:
    for out in result.outputs:
        yield from (v for v in vars(out).values() if isinstance(v, np.ndarray))


def result_bytes(result: EncodeResult) -> int:
    """What an entry holds: its arrays, and a little per output (and per token string)."""
    bookkeeping = sum(
        128 + sum(16 * len(v) for v in vars(out).values() if isinstance(v, list))
        for out in result.outputs
    )
    return 256 + bookkeeping + sum(array.nbytes for array in _arrays(result))


def request_key(parts: list[bytes | str], sequences: list[np.ndarray]) -> bytes:
    """A digest of the request's parts and its sequences' dtypes, shapes and bytes."""
    digest = hashlib.blake2b(digest_size=32)
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    for seq in sequences:
        digest.update(f"{seq.dtype.str}{seq.shape}".encode())
        digest.update(np.ascontiguousarray(seq).data)
    return digest.digest()


class ResponseCache:
    """An LRU of answers bounded in bytes, with one run per key in flight."""

    def __init__(self, max_bytes: int, metrics: Metrics) -> None:
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._entries: OrderedDict[bytes, tuple[str, EncodeResult, int]] = OrderedDict()
        self._running: dict[bytes, asyncio.Future[EncodeResult]] = {}
        self.bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    async def get_or_run(
        self,
        key: bytes,
        model: str,
        run: Callable[[], Awaitable[EncodeResult]],
        wait: Callable[[Awaitable[EncodeResult]], Awaitable[EncodeResult]],
    ) -> tuple[EncodeResult, bool]:
        """The answer for ``key`` and whether it came from the cache (or a twin in flight).
        ``wait`` bounds waiting for a twin by this request's own deadline and caller."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.metrics.cache_requests.labels("hit").inc()
            return entry[1], True
        twin = self._running.get(key)
        if twin is not None:
            try:
                result = await wait(asyncio.shield(twin))
            except Exception:
                if not (twin.done() and twin.exception() is not None):
                    raise  # our own deadline or caller, not the twin's failure
                # the first failed (its deadline, its client gone): run our own
            else:
                self.metrics.cache_requests.labels("hit").inc()
                return result, True
        self.metrics.cache_requests.labels("miss").inc()
        future: asyncio.Future[EncodeResult] = asyncio.get_running_loop().create_future()
        self._running.setdefault(key, future)
        try:
            result = await run()
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else RuntimeError())
                future.exception()  # retrieved: no "never retrieved" warning if unawaited
            raise
        finally:
            if self._running.get(key) is future:
                del self._running[key]
        future.set_result(result)
        self._put(key, model, result)
        return result, False

    def _put(self, key: bytes, model: str, result: EncodeResult) -> None:
        size = result_bytes(result)
        if size > self.max_bytes:
            return  # larger than the whole cache: never kept
        for array in _arrays(result):  # shared from now on: nobody may write into them
            array.flags.writeable = False
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        self._entries[key] = (model, result, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, _, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            self.metrics.cache_evictions.inc()
        self.metrics.cache_bytes.set(self.bytes)

    def drop_model(self, model: str) -> None:
        """Forget every answer of ``model`` (a new version was swapped in, or unloaded)."""
        for key in [k for k, (name, _, _) in self._entries.items() if name == model]:
            self.bytes -= self._entries.pop(key)[2]
        self.metrics.cache_bytes.set(self.bytes)
