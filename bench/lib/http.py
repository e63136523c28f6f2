"""The load client: keep-alive HTTP/1.1 on asyncio's sockets, framed by h11.

Light on purpose: a load generator that eats the cores it measures lowers what it
measures (an httpx client at concurrency 32 used 0.6 of 2 cores), so requests are
built once (``Request``) and answers are read with h11's parser, which frames
Content-Length and chunked bodies alike and says where a keep-alive answer ends.
Against a server that answers at once, h11 costs ~40 µs more per 33 kB answer than
the hand-written parser it replaced (70 against 27 µs of the load process's CPU) and
half as much per 6.3 MB answer (4.3 against 8.8 ms): no stream buffer copies the
bytes on their way to it.

Errors: ``Closed`` (a ``ConnectionError``) when the server closes before a whole
answer, ``Malformed`` (a ``ValueError``) when what it sent is not HTTP/1.1.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from dataclasses import dataclass, field

import h11

READ_SIZE = 2**20  # bytes read from the socket at a time (W4's answers are 4.7 MB)


class Closed(ConnectionError):
    """The server closed the connection before a whole answer."""


class Malformed(ValueError):
    """The server's bytes are not an HTTP/1.1 answer."""


@dataclass(frozen=True, eq=False)
class Request:
    """One request, ready to send many times: its h11 event is built (and its headers
    validated) once."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    method: str = "POST"
    event: h11.Request = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        headers = [("Host", "127.0.0.1"), *self.headers]
        headers.append(("Content-Length", str(len(self.body))))
        event = h11.Request(method=self.method, target=self.path, headers=headers)
        object.__setattr__(self, "event", event)

    def __reduce__(
        self,
    ) -> tuple[type[Request], tuple[str, bytes, tuple[tuple[str, str], ...], str]]:
        """Pickled as its fields (to a load process); the event is made again there."""
        return Request, (self.path, self.body, self.headers, self.method)

    @functools.cached_property
    def wire(self) -> bytes:
        """The whole request as bytes, made once: what is written for it each time."""
        head, body = _encode(h11.Connection(h11.CLIENT), self)
        return head + body


def _encode(connection: h11.Connection, request: Request) -> tuple[bytes, bytes]:
    """``request``'s head and body as h11 writes them; ``connection`` then awaits the
    answer."""
    head = connection.send(request.event) or b""
    chunks = connection.send_with_data_passthrough(h11.Data(data=request.body)) or []
    connection.send(h11.EndOfMessage())
    return head, b"".join(bytes(c) for c in chunks)


@dataclass
class Answer:
    """One HTTP answer: its status, headers (names lower-case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def size(self) -> int:
        return len(self.body)


class Connection:
    """One keep-alive connection to 127.0.0.1: requests in turn, one answer each.

    On a non-blocking socket driven by the event loop (``loop.sock_*``): what the
    kernel hands over goes to h11 as it is, with no stream buffer copying it between
    (a [1,128] answer with every attention map is 4.7 MB)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._h11 = h11.Connection(h11.CLIENT)
        self._eof = False

    @classmethod
    async def open(cls, port: int) -> Connection:
        """Connects (OSError if refused)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's streams
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def prepare(self, request: Request) -> tuple[bytes, bytes]:
        """The request's head and body as bytes to send (in pieces and at any pace, as
        the caller likes); from here on the connection waits for its answer."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        return _encode(self._h11, request)

    async def write(self, data: bytes) -> None:
        """Sends ``data`` whole (OSError if the server stops reading and closes)."""
        await self._loop.sock_sendall(self._sock, data)

    async def request(self, request: Request) -> Answer:
        """Sends ``request`` whole and reads its answer."""
        self.prepare(request)  # h11's state; the bytes are the same every time
        await self._loop.sock_sendall(self._sock, request.wire)
        return await self.receive()

    async def receive(self) -> Answer:
        """The next answer (informational 1xx answers skipped)."""
        response: h11.Response | None = None
        chunks: list[bytes | bytearray] = []
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                if self._eof:
                    raise Closed(f"closed mid-answer: {exc}") from exc
                raise Malformed(str(exc)) from exc
            if event is h11.NEED_DATA:
                data = await self._loop.sock_recv(self._sock, READ_SIZE)
                self._eof = not data
                self._h11.receive_data(data)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage) and response is not None:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in response.headers}
                return Answer(response.status_code, headers, b"".join(chunks))
            elif isinstance(event, h11.ConnectionClosed):
                raise Closed("closed without an answer")

    async def extra(self, timeout: float) -> bytes:
        """Bytes the server sent after the last answer (none are due), waiting up to
        ``timeout`` for the first of them."""
        pending, _ = self._h11.trailing_data
        if pending:
            return bytes(pending)
        try:
            return await asyncio.wait_for(self._loop.sock_recv(self._sock, 256), timeout)
        except (TimeoutError, OSError):
            return b""

    async def close(self) -> None:
        self._sock.close()
