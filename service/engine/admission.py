"""Admission: what the node has promised, counted in requests and in bytes.

Each request holds a :class:`Ticket` from arrival until its answer has been
sent. While its body arrives the ticket holds what parsing the bytes received
so far will cost (the protocol's measured model, e.g. ``wire.JsonCost``) but no
request slot, so a body that trickles costs its few bytes, never a place in
line. Once the body is read the request takes a slot (``max_queued_requests``),
and once prepared, its working memory (``limits.work_bytes``). Whatever the mix
of clients, the bytes all requests in progress may hold stay under
``max_inflight_bytes``: beyond it new work gets 429 with a Retry-After; one
request that alone needs more gets 413.

A ticket may grow from a codec thread (tokenizing priced before it runs, see
``codec_guard``), so the counts change under one lock; a ticket given back stays
given back (a thread still holding for a request already answered gets a 499).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from service.errors import ClientClosedRequest, Overloaded, PayloadTooLarge
from service.metrics import Metrics

MB = 1e6


class Admission:
    """The node's budget of request slots and bytes, shared by every protocol."""

    def __init__(
        self,
        max_requests: int,
        max_bytes: int,
        metrics: Metrics,
        retry_after: Callable[[], str],
    ) -> None:
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self.metrics = metrics
        self.retry_after = retry_after
        self.requests = 0  # requests holding a slot
        self.bytes = 0  # bytes held by every ticket
        self.lock = threading.Lock()  # tickets grow from codec threads too

    def ticket(self) -> Ticket:
        return Ticket(self)

    def saturated(self) -> str | None:
        """Why the node cannot take one more request now, if it cannot."""
        if self.requests >= self.max_requests:
            return f"all {self.max_requests} request slots are taken"
        if self.bytes >= self.max_bytes:
            return f"the memory budget ({self.max_bytes / MB:,.0f} MB) is spent"
        return None

    def refuse(self, reason: str, message: str) -> Overloaded:
        self.metrics.refusals.labels(reason).inc()
        return Overloaded(message, headers={"Retry-After": self.retry_after()})

    def _update(self, requests: int, nbytes: int) -> None:
        self.requests += requests
        self.bytes += nbytes
        self.metrics.in_flight.set(self.requests)
        self.metrics.in_flight_bytes.set(self.bytes)


class Ticket:
    """One request's share of the budget; a context manager that gives it back."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.bytes = 0
        self.slot = False
        self.released = False

    def take_slot(self) -> None:
        """Count the request as in progress (429 when every slot is taken)."""
        adm = self._admission
        if self.slot:
            return
        if adm.requests >= adm.max_requests:
            raise adm.refuse(
                "queue_full",
                f"the server is at capacity ({adm.requests} requests in progress, limit "
                f"{adm.max_requests}); retry after the Retry-After delay",
            )
        self.slot = True
        with adm.lock:
            adm._update(1, 0)

    def hold(self, nbytes: int, what: str) -> None:
        """Hold ``nbytes`` in all (a ticket only grows): 429 if the budget lacks them now,
        413 if they exceed all of it."""
        with self._admission.lock:
            self._hold(nbytes, what)

    def add(self, nbytes: int, what: str) -> None:
        """Hold ``nbytes`` more than now, read and grown under one lock (a codec thread
        and the loop may both grow a ticket): as ``hold``."""
        with self._admission.lock:
            self._hold(self.bytes + nbytes, what)

    def _hold(self, nbytes: int, what: str) -> None:
        adm = self._admission
        if self.released:
            raise ClientClosedRequest("the request was answered before its work held memory")
        extra = nbytes - self.bytes
        if extra <= 0:
            return
        if nbytes > adm.max_bytes:
            raise PayloadTooLarge(
                f"{what} needs about {nbytes / MB:,.0f} MB of server memory; the budget of "
                f"all requests in progress is {adm.max_bytes / MB:,.0f} MB: send fewer or "
                "shorter sequences, or ask for less (attention selection or reduction)"
            )
        if adm.bytes + extra > adm.max_bytes:
            raise adm.refuse(
                "memory",
                f"the server's memory budget is spent ({adm.bytes / MB:,.0f} of "
                f"{adm.max_bytes / MB:,.0f} MB held by requests in progress); retry after "
                "the Retry-After delay",
            )
        self.bytes = nbytes
        adm._update(0, extra)

    def release(self) -> None:
        with self._admission.lock:
            self._admission._update(-int(self.slot), -self.bytes)
            self.bytes, self.slot, self.released = 0, False, True

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
