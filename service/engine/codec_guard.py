"""What a request's work on a codec thread may ask of its request: stop, and hold memory.

Tokenizing runs deep below the request (``prepare`` -> ``text.tokenize`` -> the
model's ``TextFrontEnd``), on a codec thread (``Admit.off_loop``). Threading the
request's scope through every preparer for two facts would tie each of them to the
request; instead ``Admit.off_loop`` sets :data:`current` for the work it runs off the
loop for a request (the thread runs in its own copy of the context, so nothing leaks
back to the loop), and only ``engine/text.py`` reads it, at the tokenizing boundary:
it holds the tokenizing's price on the request's ticket and hands the front end a
plain ``between()`` callable. The data still flows one way (the engine asks, the
runtime and its tokenizer never see a request), and work with no request behind it
(a model's probe at load) simply finds no guard.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from service.engine.admission import Ticket
from service.errors import ClientClosedRequest


@dataclass
class CodecGuard:
    """One request's stop check and ticket, as its codec-thread work sees them."""

    ticket: Ticket
    check_deadline: Callable[[], None]  # raises DeadlineExceeded (504) once it has passed
    stopped: threading.Event = field(default_factory=threading.Event)  # set once unawaited

    def check(self) -> None:
        """Raise if the request's answer no longer waits for this work: its caller left
        or its deadline passed (the loop stopped awaiting it), or the deadline passed."""
        if self.stopped.is_set():
            raise ClientClosedRequest("the request's answer no longer waits for its work")
        self.check_deadline()

    def hold(self, nbytes: int, what: str) -> None:
        """``nbytes`` more on the request's ticket (429/413 as ``Ticket.hold``)."""
        self.check()
        self.ticket.add(nbytes, what)


current: contextvars.ContextVar[CodecGuard | None] = contextvars.ContextVar(
    "codec_guard", default=None
)
