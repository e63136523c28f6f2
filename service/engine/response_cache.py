"""Answers kept for requests that come again (re-indexing, repeated queries), in bytes.

The key is what decides an answer: the exact loaded model (a swap or reload makes
new keys, and drops the old model's entries), the sequences the graph is fed (so
texts that tokenize alike share), every resolved option, what the protocol's wire
costs (its size limit was checked against it) and, when the server has API keys,
the caller's key (answers are never shared across keys; without keys callers
cannot be told apart, so the cache is off unless ATTNSERVE_RESPONSE_CACHE_SHARED
says they may share it: ``allowed_bytes``). Entries are
:class:`EncodeResult` objects, read-only numpy arrays, evicted least recently
used past ``ATTNSERVE_RESPONSE_CACHE_BYTES``. Identical requests in flight at the
same time run once: the later ones wait for the first's answer (and run
themselves if it fails).

An answer's arrays are often views of a whole run's output (one row of a
[B, L, H, n, n] attention tensor): kept as they are, one small entry would keep
the whole run alive, uncounted. So an entry owns compact copies of every array
that is a view of a larger buffer, and its bytes are what it really holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np

from service.engine.prepare import PreparedEncode
from service.engine.types import EncodeResult
from service.metrics import Metrics
from service.settings import Settings

# Copies at least this large are made on a worker thread, not on the event loop.
OFFLOAD_COPY_BYTES = 256 * 1024
ARRAY_HEADER = 128  # a numpy array object without its data


def allowed_bytes(settings: Settings) -> int:
    """The cache's bound, or 0 (off) where callers the server cannot tell apart would
    share it: a hit's ``x-cache`` and its speed would tell one caller another's text."""
    if settings.api_key is None and not settings.response_cache_shared:
        return 0
    return settings.response_cache_bytes


def _arrays(result: EncodeResult) -> Iterator[np.ndarray]:
    for out in result.outputs:
        yield from (v for v in vars(out).values() if isinstance(v, np.ndarray))
        yield from (out.attention_summaries or {}).values()  # small, but held too


def _strings_bytes(strings: list[str]) -> int:
    """A list of strings as Python holds it: the list and each string object."""
    return sys.getsizeof(strings) + sum(sys.getsizeof(s) for s in strings)


def result_bytes(result: EncodeResult) -> int:
    """What an entry holds: its arrays (once it owns them: see ``compact``), and its
    objects: the outputs and each token string at its real size."""
    bookkeeping = sum(
        128 + sum(_strings_bytes(v) for v in vars(out).values() if isinstance(v, list))
        for out in result.outputs
    )
    return 256 + bookkeeping + sum(ARRAY_HEADER + array.nbytes for array in _arrays(result))


def _buffer_bytes(array: np.ndarray) -> int | None:
    """Bytes of the buffer ``array`` keeps alive; None when its owner is not a buffer
    numpy or Python can measure."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is None:
        return root.nbytes
    try:
        return memoryview(root.base).nbytes
    except TypeError:
        return None


def _is_view_of_more(array: np.ndarray) -> bool:
    if array.base is None:
        return False
    held = _buffer_bytes(array)
    return held is None or held > array.nbytes


def copies_needed(result: EncodeResult) -> int:
    """Bytes ``compact`` copies: the arrays that are views of a larger buffer."""
    return sum(a.nbytes for a in _arrays(result) if _is_view_of_more(a))


def compact(result: EncodeResult) -> EncodeResult:
    """``result`` with each array that is a view of a larger buffer (a run's whole
    output) replaced by its own copy, so keeping it keeps only what it shows."""
    outputs = []
    for out in result.outputs:
        changes: dict[str, Any] = {
            name: value.copy()
            for name, value in vars(out).items()
            if isinstance(value, np.ndarray) and _is_view_of_more(value)
        }
        outputs.append(dataclasses.replace(out, **changes) if changes else out)
    return dataclasses.replace(result, outputs=outputs)


def request_key(prepared: PreparedEncode, load_serial: int, authorization: str | None) -> bytes:
    """What decides the answer, digested: the loaded model (``load_serial``: a reload of
    one version is another), the graph's inputs (dtypes, shapes, bytes), every resolved
    option, the wire's cost, and the caller's ``authorization`` when the server has keys."""
    model = prepared.model
    options = dataclasses.replace(prepared.request, inputs=())
    parts: list[bytes | str] = [
        model.name,
        model.version,
        str(load_serial),
        repr(options),
        repr((prepared.graph, prepared.layers, prepared.heads, prepared.hidden_layers)),
        repr((prepared.pooling, prepared.span_tokens, prepared.by_token_ids)),
    ]
    if authorization is not None:
        token = authorization.encode("utf-8", "surrogateescape")
        parts.append(hashlib.sha256(token).digest())
    digest = hashlib.blake2b(digest_size=32)
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    for seq in prepared.sequences:
        digest.update(f"{seq.dtype.str}{seq.shape}".encode())
        digest.update(np.ascontiguousarray(seq).data)
    return digest.digest()


class ResponseCache:
    """An LRU of answers bounded in bytes, with one run per key in flight."""

    def __init__(
        self,
        max_bytes: int,
        metrics: Metrics,
        offload: Callable[
            [Callable[[EncodeResult], EncodeResult], EncodeResult], Awaitable[EncodeResult]
        ]
        | None = None,
    ) -> None:
        """``offload(work, result)`` runs ``work(result)`` off the event loop (large copies)."""
        self.max_bytes = max_bytes
        self.metrics = metrics
        self._offload = offload
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
            kept = await self._own(result)  # still "in flight": a twin waits, not reruns
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else RuntimeError())
                future.exception()  # retrieved: no "never retrieved" warning if unawaited
            raise
        finally:
            if self._running.get(key) is future:
                del self._running[key]
        future.set_result(result)
        if kept is not None:
            self._put(key, model, kept)
        return result, False

    async def _own(self, result: EncodeResult) -> EncodeResult | None:
        """What the entry keeps: ``result`` owning compact copies of its arrays; None
        when it is larger than the whole cache (never kept, nothing copied)."""
        if result_bytes(result) > self.max_bytes:
            return None
        if self._offload is not None and copies_needed(result) >= OFFLOAD_COPY_BYTES:
            return await self._offload(compact, result)
        return compact(result)

    def _put(self, key: bytes, model: str, result: EncodeResult) -> None:
        size = result_bytes(result)
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
