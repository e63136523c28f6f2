"""``GRPCInferenceService`` on ``grpc.aio``, in the HTTP server's process and event loop.

Each call opens the engine's request scope from its metadata (``authorization``,
``x-request-id``) and its deadline, enters it with the RPC's access, and closes
it on every exit path, as the HTTP middleware does; what a call may do is the
engine's rule, never this module's. The standard ``grpc.health.v1`` service
follows readiness (NOT_SERVING while warming up and from SIGTERM on).
Message sizes are bounded by the HTTP limits (ATTNSERVE_MAX_BODY_BYTES in,
ATTNSERVE_MAX_RESPONSE_BYTES out); keepalive and concurrent streams are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from service.engine import OFFLOAD_BYTES, Engine, RequestScope
from service.engine.scope import CLIENT_CLOSED, Access, Caller
from service.errors import NotReady, ServiceError
from service.protocols.kserve_grpc import codec, errors
from service.protocols.kserve_v2 import tensors
from service.protocols.kserve_v2.routes import (
    EXTENSIONS,
    PLATFORM,
    SERVER_NAME,
    SERVER_VERSION,
)
from service.protocols.protocol import Protocol

log = logging.getLogger("attnserve.grpc")
T = TypeVar("T")

SERVICE = "inference.GRPCInferenceService"
# Room for the message framing around the tensors' bytes.
FRAMING_BYTES = 64 * 1024
# How often the health service looks at readiness (seconds).
HEALTH_POLL = 0.25
# Decoded tensors and the message they came from, at their peak (as HTTP's binary body).
MESSAGE_EXPANSION = 2
KEEPALIVE = (
    ("grpc.keepalive_time_ms", 60_000),  # ping an idle client every minute
    ("grpc.keepalive_timeout_ms", 20_000),  # and drop it if it does not answer
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),  # refuse ping floods
    ("grpc.max_connection_idle_ms", 300_000),
    ("grpc.max_concurrent_streams", 100),
)


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The Open Inference Protocol's RPCs, each a thin translation onto the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def _call(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        method: str,
        access: Access,
        work: Callable[[RequestScope], Awaitable[T]],
    ) -> T:
        metadata = {key: value for key, value in context.invocation_metadata() or ()}
        remaining = context.time_remaining()
        caller = Caller(
            protocol="grpc",
            request_id=_text(metadata.get("x-request-id")),
            authorization=_text(metadata.get("authorization")),
            # A deadline already passed is the smallest positive timeout: refused as passed.
            timeout=None if remaining is None else f"{max(remaining, 1e-6):.6f}",
            traceparent=_text(metadata.get("traceparent")),
            tracestate=_text(metadata.get("tracestate")),
        )
        scope = self.engine.open_scope(caller)
        route = f"/{SERVICE}/{method}"
        status = CLIENT_CLOSED
        start = time.monotonic()
        try:
            await context.send_initial_metadata((("x-request-id", scope.request_id),))
            scope.enter(access)
            result = await work(scope)
            status = 200
            timing = scope.timing
            context.set_trailing_metadata(
                (
                    ("x-queue-time", f"{timing.queue:.6f}"),
                    ("x-compute-time", f"{timing.compute:.6f}"),
                )
            )
            return result
        except ServiceError as exc:
            status = exc.status_code
            code, message, trailers = errors.status(exc)
            context.set_trailing_metadata(trailers)
            await context.abort(code, message)
            raise  # abort raises; this line only tells the type checker
        except Exception:  # a bug of ours (CancelledError, a caller gone, is not one)
            status = 500
            raise
        finally:
            # Logged before the scope closes: the record carries the request id.
            log.info(
                "grpc %s %d %.1fms",
                route,
                status,
                (time.monotonic() - start) * 1000,
                extra={"protocol": "grpc", "status": status},
            )
            scope.close(route, status)

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerLiveResponse:
        async def live(scope: RequestScope) -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=_passes(self.engine.check_live))

        return await self._call(context, "ServerLive", Access.OPEN, live)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerReadyResponse:
        async def ready(scope: RequestScope) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=_passes(self.engine.check_ready))

        return await self._call(context, "ServerReady", Access.OPEN, ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ServerMetadataResponse:
        async def metadata(scope: RequestScope) -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(
                name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
            )

        return await self._call(context, "ServerMetadata", Access.OPEN, metadata)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelReadyResponse:
        async def ready(scope: RequestScope) -> pb.ModelReadyResponse:
            self.engine.model(request.name, request.version or None)
            return pb.ModelReadyResponse(ready=_passes(self.engine.require_ready))

        return await self._call(context, "ModelReady", Access.GUARDED, ready)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelMetadataResponse:
        async def metadata(scope: RequestScope) -> pb.ModelMetadataResponse:
            info = self.engine.model(request.name, request.version or None)
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=info.name,
                versions=self.engine.model_versions(info.name),
                platform=PLATFORM,
                inputs=[
                    tensor(name=n, datatype=d, shape=s) for n, d, s in tensors.model_inputs(info)
                ],
                outputs=[
                    tensor(name=n, datatype=d, shape=s)
                    for n, d, s in tensors.available_outputs(info)
                ],
            )

        return await self._call(context, "ModelMetadata", Access.GUARDED, metadata)

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelInferResponse:
        async def infer(scope: RequestScope) -> pb.ModelInferResponse:
            engine = self.engine
            info = engine.model(request.model_name, request.model_version or None)
            # The message is in memory already (bounded by the receive limit): hold it
            # and what decoding it makes against the request's ticket, as HTTP bodies are.
            scope.admitted().hold(MESSAGE_EXPANSION * request.ByteSize(), "this request's message")
            version = request.model_version or None
            result, reply = await engine.encode(
                lambda: codec.infer_request(request, info, version), scope
            )
            if result.response_bytes > OFFLOAD_BYTES:  # as HTTP: a thread hop costs ~0.3 ms
                return await engine.off_loop(codec.infer_response, result, reply)
            return codec.infer_response(result, reply)

        return await self._call(context, "ModelInfer", Access.WORK, infer)

    # Triton's model repository extension (ATTNSERVE_MODEL_CONTROL explicit or poll).

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RepositoryIndexResponse:
        async def index(scope: RequestScope) -> pb.RepositoryIndexResponse:
            entries = self.engine.repository_index()
            if request.ready:
                entries = [e for e in entries if e["state"] == "READY"]
            return pb.RepositoryIndexResponse(
                models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
            )

        return await self._call(context, "RepositoryIndex", Access.ADMIN, index)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RepositoryModelLoadResponse:
        async def load(scope: RequestScope) -> pb.RepositoryModelLoadResponse:
            await self.engine.load_model(request.model_name)
            return pb.RepositoryModelLoadResponse()

        return await self._call(context, "RepositoryModelLoad", Access.ADMIN, load)

    async def RepositoryModelUnload(
        self,
        request: pb.RepositoryModelUnloadRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.RepositoryModelUnloadResponse:
        async def unload(scope: RequestScope) -> pb.RepositoryModelUnloadResponse:
            await self.engine.unload_model(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._call(context, "RepositoryModelUnload", Access.ADMIN, unload)


def _text(value: str | bytes | None) -> str | None:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _passes(check: Callable[[], object]) -> bool:
    try:
        check()
    except NotReady:
        return False
    return True


def concurrent_calls(engine: Engine) -> int:
    """Calls in progress at most; grpc refuses more itself (RESOURCE_EXHAUSTED, no hint).

    A call's message is whole in memory before its handler runs, so this bounds those
    messages: as many largest bodies as the memory budget holds (64 by default), plus
    the codec slots. Below it the engine's admission decides, with its retry hint.
    """
    settings = engine.settings
    return max(1, settings.max_inflight_bytes // settings.max_body_bytes) + (
        settings.max_concurrent_codecs
    )


class ReadinessHealth(health.aio.HealthServicer):
    """``grpc.health.v1`` following readiness as ``/health/ready`` does: SERVING when
    ready, NOT_SERVING while warming up or saturated, and for good from SIGTERM on.
    ``Check`` looks at readiness when called; ``Watch`` streams learn of a change
    within ``HEALTH_POLL``."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    async def refresh(self) -> None:
        if self.engine.shutting_down:
            await self.enter_graceful_shutdown()
            return
        ready = _passes(self.engine.check_ready)  # as /health/ready: not while saturated
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        for name in ("", SERVICE):
            await self.set(name, status)

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> health_pb2.HealthCheckResponse:
        await self.refresh()
        return await super().Check(request, context)

    async def follow(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(HEALTH_POLL)


@contextlib.asynccontextmanager
async def serve(engine: Engine) -> AsyncIterator[None]:
    """The gRPC server on ATTNSERVE_GRPC_PORT (0: none), from engine start to stop."""
    settings = engine.settings
    if settings.grpc_port == 0:
        yield
        return
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", settings.max_response_bytes + FRAMING_BYTES),
            *KEEPALIVE,
        ],
        maximum_concurrent_rpcs=concurrent_calls(engine),
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(engine), server)
    health_service = ReadinessHealth(engine)
    await health_service.refresh()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    address = f"{settings.host}:{settings.grpc_port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    follower = asyncio.create_task(health_service.follow())
    log.info("gRPC (Open Inference Protocol) on %s", address)
    try:
        yield
    finally:
        follower.cancel()
        await health_service.enter_graceful_shutdown()
        # In-flight calls finish (new ones were refused since SIGTERM, by the engine).
        await server.stop(grace=settings.shutdown_timeout)


PROTOCOL = Protocol("kserve_grpc", serve=serve)
