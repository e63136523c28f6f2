"""What the hostile-client and shutdown tests share: requests written byte by byte, and
what the server holds for a body it is reading."""

from __future__ import annotations

from service.protocols.wire import JsonCost


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def post_head(path: str, length: int, **headers: str) -> bytes:
    """The request line and headers of a JSON POST announcing ``length`` body bytes."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def held_for(received: bytes) -> int:
    """What admission holds for the part of a JSON body received so far (its parse cost)."""
    cost = JsonCost()
    cost.add(received)
    return cost.decoded_bytes
