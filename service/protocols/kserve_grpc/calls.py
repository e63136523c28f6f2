"""One gRPC call's life, as HTTP's middleware and body reading give a request's.

grpc.aio reads a unary call's message before its handler runs, and its only
admission is one server-wide count of calls taken when their headers arrive, so
calls that never send their message would shut out every other call, health
checks included. Here each method is registered as a stream-stream handler of
bytes (the same frames on the wire as a unary call), so that:

- a call takes nothing from the engine's admission while its message is
  awaited, and that wait is bounded as an HTTP body's (ATTNSERVE_BODY_TIMEOUT);
- its message is decoded here: a malformed one is INVALID_ARGUMENT, counted and
  logged as any refused call (one line);
- its answer is written while its ticket still holds it (its bytes stay in the
  memory budget until HTTP/2 flow control has taken them). A client that leaves
  it unread for ATTNSERVE_SEND_TIMEOUT has its connection dropped, as HTTP does
  (``connections.drop``: grpc cannot end a call whose message is still queued),
  and the call counts as 499.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from service.engine import Engine, RequestScope
from service.engine.scope import CLIENT_CLOSED, MAX_ASKED_TIMEOUT, Access, Caller
from service.errors import InvalidInput, ServiceError
from service.protocols.kserve_grpc import connections, errors

log = logging.getLogger("attnserve.grpc")

# A message and what decoding it makes, at their peak (as HTTP's binary body).
MESSAGE_EXPANSION = 2
# After dropping a connection, how long to wait for grpc to end the call's write.
DROP_GRACE = 5.0

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Method:
    """One RPC: its request message type, what it needs (``Access``) and its work."""

    name: str
    request: type[Message]
    access: Access
    work: Callable[[Any, RequestScope], Awaitable[Message]]


def generic_handler(
    engine: Engine, service: str, methods: Iterable[Method], port: int
) -> grpc.GenericRpcHandler:
    """The handlers of ``service``'s ``methods``, each call run by :class:`Call`."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        m.name: grpc.stream_stream_rpc_method_handler(Call(engine, service, m, port).handle)
        for m in methods
    }
    return grpc.method_handlers_generic_handler(service, handlers)


def caller(context: Context) -> Caller:
    """What the call's metadata and deadline say, for the engine's scope."""
    metadata = {key: value for key, value in context.invocation_metadata() or ()}
    remaining = context.time_remaining()
    # A deadline already passed is the smallest positive timeout (refused as passed);
    # one beyond what a request may ask is capped to it (ATTNSERVE_REQUEST_TIMEOUT
    # caps it further).
    timeout = None if remaining is None else min(max(remaining, 1e-6), MAX_ASKED_TIMEOUT)
    return Caller(
        protocol="grpc",
        request_id=_text(metadata.get("x-request-id")),
        authorization=_text(metadata.get("authorization")),
        timeout=None if timeout is None else f"{timeout:.6f}",
        traceparent=_text(metadata.get("traceparent")),
        tracestate=_text(metadata.get("tracestate")),
    )


class Call:
    """Runs each call of one method: scope, message, work, answer, on every exit path."""

    def __init__(self, engine: Engine, service: str, method: Method, port: int) -> None:
        self.engine, self.method, self.port = engine, method, port
        self.route = f"/{service}/{method.name}"

    async def handle(self, requests: object, context: Context) -> None:
        failed: tuple[grpc.StatusCode, str] | None = None
        start = time.monotonic()
        with self.engine.request(caller(context)) as scope:
            scope.route = self.route
            try:
                await context.send_initial_metadata((("x-request-id", scope.request_id),))
                scope.enter(self.method.access)
                raw = await self._message(context)
                if scope.ticket is not None:  # (grpc itself bounds its size)
                    meter = self.engine.body_meter(scope)
                    meter.add(len(raw), held=MESSAGE_EXPANSION * len(raw))
                response = await self.method.work(self._decode(raw), scope)
                answer = response.SerializeToString()
                scope.status, scope.cut = 200, True  # cut until the client has taken it
                context.set_trailing_metadata(
                    (
                        ("x-queue-time", f"{scope.timing.queue:.6f}"),
                        ("x-compute-time", f"{scope.timing.compute:.6f}"),
                    )
                )
                scope.cut = not await self._send(context, answer)
            except ServiceError as exc:
                scope.status = exc.status_code
                code, message, trailers = errors.status(exc)
                context.set_trailing_metadata(trailers)
                failed = code, message
            finally:
                # Logged before the scope closes: the record carries the request id.
                log.info(
                    "grpc %s %d %.1fms",
                    self.route,
                    CLIENT_CLOSED if scope.cut else scope.status,
                    (time.monotonic() - start) * 1000,
                    extra={"protocol": "grpc", "status": scope.status},
                )
        if failed is not None:  # after the scope closed: abort ends the call by raising
            await context.abort(*failed)

    async def _message(self, context: Context) -> bytes:
        """The call's one message, within ATTNSERVE_BODY_TIMEOUT (408: DEADLINE_EXCEEDED)."""
        async with self.engine.body_read("the call's message"):
            raw = await context.read()
        if not isinstance(raw, bytes):  # grpc.aio.EOF: half-closed with no message
            raise InvalidInput("the call ended without its request message")
        return raw

    def _decode(self, raw: bytes) -> Message:
        try:
            return self.method.request.FromString(raw)
        except DecodeError as exc:
            raise InvalidInput(
                f"the request is not a valid {self.method.request.DESCRIPTOR.full_name} "
                f"message ({exc})"
            ) from None

    async def _send(self, context: Context, answer: bytes) -> bool:
        """Write the answer; False if the client left it unread for ATTNSERVE_SEND_TIMEOUT
        (then its connection is dropped, which ends the call and frees the answer)."""
        write = asyncio.ensure_future(context.write(answer))
        # Fails if the connection goes (this call cancelled meanwhile): nobody to tell.
        write.add_done_callback(lambda task: task.cancelled() or task.exception())
        timeout = self.engine.settings.send_timeout
        done, _ = await asyncio.wait((write,), timeout=timeout)
        if done:
            write.result()
            return True
        self.engine.metrics.refusals.labels("send_timeout").inc()
        peer = context.peer()
        dropped = connections.drop(peer, self.port)
        log.info(
            "%s: dropping the gRPC connection of %s, which read nothing of its answer for %g s%s",
            self.route,
            peer,
            timeout,
            "" if dropped else " (its socket was not found)",
        )
        await asyncio.wait((write,), timeout=DROP_GRACE)
        write.cancel()
        return False


def _text(value: str | bytes | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value
