"""A minimal HTTP/2 client for gRPC probes that no well-behaved client would send.

grpc's own clients respect the server's stream limit, send a call's message
with its headers and read every answer; a hostile client does none of that.
This one speaks just enough HTTP/2 (RFC 9113) to open streams with headers and
no message, send a message, and never read an answer (or read it as slowly as
it is told to, ``grant``): it acknowledges SETTINGS
and PINGs (so the server keeps the connection), grants no flow-control window
beyond what it is told to, and records per stream the DATA bytes and
RST_STREAM codes it received. Headers are sent as HPACK literals and answers'
headers are not decoded (their status is read from the server's metrics).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import defaultdict

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE's initial value


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first``'s high bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A header as an HPACK literal without indexing, new name, no Huffman."""
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x00" + _integer(len(raw_name), 7) + raw_name + _integer(len(raw_value), 7) + raw_value


def grpc_message(payload: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class RawH2:
    """One HTTP/2 connection to ``host:port``; ``window`` is the initial stream window
    it grants (the connection's own window stays at the protocol's 65,535 bytes)."""

    def __init__(self, host: str, port: int, *, window: int = 65_535) -> None:
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()
        self.next_stream = 1
        self.data_bytes: dict[int, int] = defaultdict(int)
        self.resets: dict[int, int] = {}  # stream -> RST_STREAM error code
        self.ended: set[int] = set()  # streams the server ended (trailers or END_STREAM)
        self.goaway: int | None = None
        self.closed = threading.Event()
        settings = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0)
        settings += struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, window)
        self._send(PREFACE + self._frame(SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload))[1:]
            + struct.pack(">BBI", kind, flags, stream)
            + (payload)
        )

    def _send(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def open(self, path: str, metadata: dict[str, str] | None = None) -> int:
        """A new stream: a POST's headers, and no message yet. Returns its id."""
        stream = self.next_stream
        self.next_stream += 2
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *(metadata or {}).items(),
        ]
        block = b"".join(_literal(k, v) for k, v in fields)
        self._send(self._frame(HEADERS, END_HEADERS, stream, block))
        return stream

    def send(self, stream: int, payload: bytes, *, end: bool = True) -> None:
        """``payload`` (already framed, e.g. by ``grpc_message``) as DATA frames of the
        protocol's least maximum size. The caller keeps within the server's windows
        (65,535 bytes in all until it grants more; this client does not track them)."""
        chunks = [payload[i : i + MAX_FRAME] for i in range(0, len(payload), MAX_FRAME)]
        for i, chunk in enumerate(chunks):
            last = end and i == len(chunks) - 1
            self._send(self._frame(DATA, END_STREAM if last else 0, stream, chunk))

    def grant(self, stream: int, size: int) -> None:
        """Let the server send ``size`` more bytes on ``stream`` and on the connection
        (a WINDOW_UPDATE for each): a reader taking its answer a little at a time."""
        increment = struct.pack(">I", size)
        self._send(self._frame(WINDOW_UPDATE, 0, stream, increment))
        self._send(self._frame(WINDOW_UPDATE, 0, 0, increment))

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags, stream = struct.unpack(">BBI", buffer[3:9])
                    payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                    self._on_frame(kind, flags, stream & 0x7FFFFFFF, payload)
        except OSError:
            pass
        finally:
            self.closed.set()

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            self._send(self._frame(SETTINGS, ACK, 0, b""))
        elif kind == PING and not flags & ACK:
            self._send(self._frame(PING, ACK, 0, payload))
        elif kind == DATA:
            self.data_bytes[stream] += len(payload)
            if flags & END_STREAM:
                self.ended.add(stream)
        elif kind == HEADERS and flags & END_STREAM:
            self.ended.add(stream)
        elif kind == RST_STREAM:
            self.resets[stream] = struct.unpack(">I", payload)[0]
        elif kind == GOAWAY:
            self.goaway = struct.unpack(">I", payload[4:8])[0]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(timeout=5)
