"""Dropping one client's gRPC connection, which grpc.aio offers no way to do.

A server handler cannot end a call whose answer still waits for the client's
HTTP/2 flow-control window (grpc refuses the status while the message is
queued), so an answer a client never reads would stay in memory for as long as
the client keeps the connection open. HTTP drops such a connection
(``connection_guard.SendStall``); here the same is done by finding this
process's socket from the call's peer to our gRPC port and shutting it down:
grpc then sees the connection end, cancels its calls and frees their messages.
Linux only (``/proc/self/fd``); elsewhere nothing is found and nothing dropped.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from urllib.parse import unquote

FDS = "/proc/self/fd"


def peer_address(peer: str) -> tuple[str, int] | None:
    """grpc's peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", URL-quoted or not) as
    (host, port); None for anything else (e.g. a Unix socket)."""
    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _normal(host.strip("[]")), int(port)
    except ValueError:
        return None


def _normal(host: str) -> str:
    """An IP address as one spelling (an IPv4-mapped IPv6 address as its IPv4)."""
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def drop(peer: str, port: int) -> bool:
    """Shut down our TCP socket on ``port`` whose remote end is ``peer``; False if none."""
    wanted = peer_address(peer)
    if wanted is None:
        return False
    try:
        names = os.listdir(FDS)
    except OSError:
        return False
    for name in names:
        try:
            if not os.readlink(f"{FDS}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with contextlib.closing(sock):
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if sock.type != socket.SOCK_STREAM or sock.getsockname()[1] != port:
                    continue
                remote = sock.getpeername()
            except OSError:
                continue
            if (_normal(remote[0]), remote[1]) == wanted:
                # Shut down, not closed: the descriptor stays grpc's, which now sees the
                # connection end and releases it itself.
                sock.shutdown(socket.SHUT_RDWR)
                return True
    return False
