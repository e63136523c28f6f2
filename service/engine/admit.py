"""The one request prologue, and the codec threads it hops to.

Every request kind (encode, sparse vectors, tokenize, decode) begins the same
way: its ticket (taken when the protocol entered the scope, holding the body)
takes a slot, a request already past its deadline costs no parsing, and the
protocol's ``parse`` runs with the engine's checks in one hop off the event loop
(or on it, for a small body whose preparation is cheap).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from service.engine import codec_guard, limits
from service.engine.admission import Ticket
from service.engine.execute import Executor
from service.engine.scope import RequestScope
from service.errors import PayloadTooLarge
from service.settings import Settings

T = TypeVar("T")
R = TypeVar("R")  # the typed request a protocol parses
P = TypeVar("P")  # what the engine makes of it
W = TypeVar("W")  # what a protocol keeps from parsing to writing its answer

# A body whose parse the ticket holds at up to this (a JSON body of up to ~64 KiB:
# ~13 bytes per byte plus its values, see wire.JsonCost) is parsed on the event loop,
# and prepared there too when that is cheap (arrays only): that takes well under the
# ~0.3 ms a round trip to a worker thread costs.
INLINE_HELD_BYTES = 64 * 1024 * 16


class BodyMeter:
    """A request body (or call message) counted as its bytes arrive, not as announced (a
    Content-Length costs the client nothing to send, the bytes do): refused past
    ATTNSERVE_MAX_BODY_BYTES or the JSON item bound (413), and held on the request's
    ticket at what parsing it will cost, as the protocol prices it."""

    def __init__(self, ticket: Ticket, settings: Settings) -> None:
        self._ticket = ticket
        self._settings = settings
        self.limit = settings.max_body_bytes
        self.size = 0

    def announced(self, length: int) -> None:
        """413 at once for a body announced larger than the limit."""
        if length > self.limit:
            raise PayloadTooLarge(f"request body of {length:,} bytes exceeds {self.limit:,}")

    def add(self, size: int, *, json_items: int = 0, held: int) -> None:
        """``size`` more bytes came; the body so far holds ``json_items`` JSON arrays,
        objects and strings and costs ``held`` bytes to parse."""
        self.size += size
        if self.size > self.limit:
            raise PayloadTooLarge(f"request body exceeds {self.limit:,} bytes")
        limits.check_json_items(json_items, self._settings)
        self._ticket.hold(held, "this request's body")


class Admit:
    """Slots, deadline and the thread hop of every request."""

    def __init__(self, settings: Settings, executor: Executor) -> None:
        self._settings = settings
        self._executor = executor
        self._codec_slots = asyncio.Semaphore(settings.max_concurrent_codecs)
        # Small requests' codec work has a lane of its own: a one-text request is never
        # tokenized after the megabyte bodies queued before it (see off_loop).
        self._small_codec_slot = asyncio.Semaphore(1)

    async def off_loop(
        self,
        work: Callable[..., T],
        *args: Any,
        small: bool = False,
        scope: RequestScope | None = None,
    ) -> T:
        """``work(*args)`` on a worker thread, at most ATTNSERVE_MAX_CONCURRENT_CODECS at once.

        Decoding, tokenizing and serialising hold the GIL or a core; left unbounded, a
        burst of them starves the inference lanes of the cores it runs on. ``small``
        work (a body parsed on the loop: tens of ms at most) takes a slot of its own,
        one at a time, so it never waits behind large bodies being parsed.

        The slot is held until the thread ends, even once nobody awaits it (a thread
        cannot be cancelled): else the work of a request already answered 504 or
        gone runs on beside the next one's. For a request's ``scope`` the work sees a
        ``codec_guard.CodecGuard`` (its deadline, its ticket, ``stopped`` once this
        await is cancelled), so tokenizing stops between parts and frees the slot.
        """
        slots = self._small_codec_slot if small else self._codec_slots
        guard = None if scope is None else self._guard(scope)

        def run() -> T:
            codec_guard.current.set(guard)  # in the thread's own copy of the context
            return work(*args)

        await slots.acquire()
        try:
            thread = asyncio.ensure_future(asyncio.to_thread(run))
        except BaseException:
            slots.release()
            raise
        thread.add_done_callback(lambda done: _released(done, slots))
        try:
            return await asyncio.shield(thread)
        except asyncio.CancelledError:
            if guard is not None:
                guard.stopped.set()
            raise

    def _guard(self, scope: RequestScope) -> codec_guard.CodecGuard:
        def check_deadline() -> None:
            self._executor.check_deadline(scope.deadline, "while its texts were tokenized")

        return codec_guard.CodecGuard(scope.admitted(), check_deadline)

    def body(self, scope: RequestScope) -> BodyMeter:
        """The meter of a WORK request's body (its ticket taken when it entered)."""
        return BodyMeter(scope.admitted(), self._settings)

    def begin(self, scope: RequestScope, when: str) -> Ticket:
        """The prologue's cheap facts: a slot for the ticket, then the deadline (504 if
        already past ``when`` the work would begin)."""
        ticket = scope.admitted()
        ticket.take_slot()
        self._executor.check_deadline(scope.deadline, when)
        return ticket

    async def prepared(
        self,
        scope: RequestScope,
        parse: Callable[[], tuple[R, W]],
        prepare: Callable[[R], P],
        inline: Callable[[R], bool],
    ) -> tuple[P, W]:
        """Begin, then ``parse`` and ``prepare``: in one hop off the loop for a large
        body; else parsed on the loop and prepared there if ``inline(request)`` (cheap
        checks, which may refuse it) says so, or in the small lane off it."""
        ticket = self.begin(scope, "before its work began")
        began = time.monotonic()
        if ticket.bytes > INLINE_HELD_BYTES:

            def both() -> tuple[P, W]:
                request, wire = parse()
                return prepare(request), wire

            done, wire = await self.off_loop(both, scope=scope)
        else:
            request, wire = parse()
            if inline(request):
                done = prepare(request)
            else:
                done = await self.off_loop(prepare, request, small=True, scope=scope)
        scope.timing.prepare_began, scope.timing.prepare_ended = began, time.monotonic()
        return done, wire


def _released(thread: asyncio.Future[Any], slots: asyncio.Semaphore) -> None:
    """A codec thread ended: its slot is free; an outcome nobody awaited is dropped."""
    slots.release()
    if not thread.cancelled():
        with contextlib.suppress(BaseException):
            thread.exception()  # retrieved, so asyncio logs no "never retrieved"
