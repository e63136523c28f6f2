"""``GRPCInferenceService`` on ``grpc.aio``, in the HTTP server's process and event loop.

Each RPC here is a translation onto the engine; ``calls.py`` runs every call
(its request scope from metadata and deadline, the bounded wait for its message,
admission by the engine once the message is in, the bounded send of its answer),
so what a call may do is the engine's rule, never this module's. There is no
server-wide cap on calls (grpc's would count a call from its headers on, health
checks in the same pool): connections are capped (ATTNSERVE_GRPC_MAX_CONNECTIONS,
beyond which grpc closes a new one at once); per connection, streams are bounded;
per call, the time it may take to send its message and to read its answer. The standard
``grpc.health.v1`` service follows readiness (NOT_SERVING while warming up and
from SIGTERM on). Message sizes are bounded by the HTTP limits
(ATTNSERVE_MAX_BODY_BYTES in, ATTNSERVE_MAX_RESPONSE_BYTES out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from service.engine import (
    CLASSIFY,
    ENCODE,
    RERANK,
    Engine,
    MultiVectorResult,
    RequestScope,
    RerankResult,
)
from service.engine.scope import Access
from service.errors import CannotStart, NotReady
from service.protocols.kserve_grpc import calls, codec
from service.protocols.kserve_grpc.calls import Method
from service.protocols.open_inference import classify, multi_vector, rerank, tensors
from service.protocols.open_inference.metadata import (
    EXTENSIONS,
    PLATFORM,
    SERVER_NAME,
    SERVER_VERSION,
)
from service.protocols.protocol import Protocol

log = logging.getLogger("attnserve.grpc")

SERVICE = "inference.GRPCInferenceService"
# Room for the message framing around the tensors' bytes.
FRAMING_BYTES = 64 * 1024
# How often the health service looks at readiness (seconds).
HEALTH_POLL = 0.25
KEEPALIVE = (
    ("grpc.keepalive_time_ms", 60_000),  # ping an idle client every minute
    ("grpc.keepalive_timeout_ms", 20_000),  # and drop it if it does not answer
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),  # refuse ping floods
    ("grpc.max_connection_idle_ms", 300_000),
    ("grpc.max_concurrent_streams", 100),
)


class GrpcPortTaken(CannotStart):
    """ATTNSERVE_GRPC_PORT cannot be listened on: the server refuses to start."""

    def __init__(self, address: str) -> None:
        super().__init__(
            f"cannot listen for gRPC on {address}: the port is taken "
            "(another server holds it?); set ATTNSERVE_GRPC_PORT to a free one, 0 for none"
        )


class InferenceService:
    """The Open Inference Protocol's RPCs, each a thin translation onto the engine; how a
    call is read, admitted, answered and closed is ``calls.py``'s."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def methods(self) -> list[Method]:
        return [
            Method("ServerLive", pb.ServerLiveRequest, Access.OPEN, self.server_live),
            Method("ServerReady", pb.ServerReadyRequest, Access.OPEN, self.server_ready),
            Method("ServerMetadata", pb.ServerMetadataRequest, Access.OPEN, self.server_metadata),
            Method("ModelReady", pb.ModelReadyRequest, Access.GUARDED, self.model_ready),
            Method("ModelMetadata", pb.ModelMetadataRequest, Access.GUARDED, self.model_metadata),
            Method("ModelInfer", pb.ModelInferRequest, Access.WORK, self.model_infer),
            # Triton's model repository extension (ATTNSERVE_MODEL_CONTROL explicit or poll).
            Method("RepositoryIndex", pb.RepositoryIndexRequest, Access.ADMIN, self.index),
            Method("RepositoryModelLoad", pb.RepositoryModelLoadRequest, Access.ADMIN, self.load),
            Method(
                "RepositoryModelUnload", pb.RepositoryModelUnloadRequest, Access.ADMIN, self.unload
            ),
        ]

    async def server_live(
        self, request: pb.ServerLiveRequest, scope: RequestScope
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=_passes(self.engine.check_live))

    async def server_ready(
        self, request: pb.ServerReadyRequest, scope: RequestScope
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=_passes(self.engine.check_ready))

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, scope: RequestScope
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
        )

    async def model_ready(
        self, request: pb.ModelReadyRequest, scope: RequestScope
    ) -> pb.ModelReadyResponse:
        self.engine.model(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=_passes(self.engine.require_ready))

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, scope: RequestScope
    ) -> pb.ModelMetadataResponse:
        info = self.engine.model(request.name, request.version or None)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=info.name,
            versions=self.engine.model_versions(info.name),
            platform=PLATFORM,
            inputs=[tensor(name=n, datatype=d, shape=s) for n, d, s in tensors.model_inputs(info)],
            outputs=[
                tensor(name=n, datatype=d, shape=s) for n, d, s in tensors.available_outputs(info)
            ],
        )

    async def model_infer(
        self, request: pb.ModelInferRequest, scope: RequestScope
    ) -> pb.ModelInferResponse:
        engine = self.engine
        info = engine.model(request.model_name, request.model_version or None)
        version = request.model_version or None
        if rerank.is_reranker(info):  # a query and documents in, scores out
            ranked, _ = await engine.handle(
                RERANK, lambda: (codec.rerank_request(request, info), None), scope
            )
            return codec.rerank_response(ranked, request, info.version)
        if classify.is_classifier(info):  # texts in, scores per label out
            classified, outputs = await engine.handle(
                CLASSIFY, lambda: codec.classify_request(request, info), scope
            )
            return codec.classify_response(classified, outputs, request, info.version)
        if multi_vector.is_multi_vector(info):  # texts in, vectors out (or query, documents)
            answered, outputs = await engine.handle(
                multi_vector.LATE_INTERACTION,
                lambda: codec.multi_vector_request(request, info),
                scope,
            )
            if isinstance(answered, RerankResult):  # MaxSim scores
                return codec.rerank_response(answered, request, info.version)

            def write(result: MultiVectorResult, outputs: list[str]) -> pb.ModelInferResponse:
                return codec.multi_vector_response(result, outputs, request, info.version)

            return await engine.render(answered, write, outputs)
        result, reply = await engine.handle(
            ENCODE, lambda: codec.infer_request(request, info, version), scope
        )
        return await engine.render(result, codec.infer_response, reply)

    async def index(
        self, request: pb.RepositoryIndexRequest, scope: RequestScope
    ) -> pb.RepositoryIndexResponse:
        entries = self.engine.repository_index()
        if request.ready:
            entries = [e for e in entries if e["state"] == "READY"]
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries]
        )

    async def load(
        self, request: pb.RepositoryModelLoadRequest, scope: RequestScope
    ) -> pb.RepositoryModelLoadResponse:
        await self.engine.load_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def unload(
        self, request: pb.RepositoryModelUnloadRequest, scope: RequestScope
    ) -> pb.RepositoryModelUnloadResponse:
        await self.engine.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def _passes(check: Callable[[], object]) -> bool:
    try:
        check()
    except NotReady:
        return False
    return True


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
            # grpc core closes a connection accepted beyond it (the HTTP side's cap is
            # connection_guard's): no call of its starts, nothing of it is held.
            ("grpc.max_allowed_incoming_connections", settings.grpc_max_connections),
            # grpc sets SO_REUSEPORT by default: a second server would bind a port another
            # one holds and take turns answering its calls. One server per port, as HTTP.
            ("grpc.so_reuseport", 0),
            *KEEPALIVE,
        ],
    )
    # No maximum_concurrent_rpcs: grpc would count a call from its headers on, in one
    # pool with health checks. Calls are admitted by the engine once their message is in.
    address = f"{settings.host}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind to address …"
        port = 0
    if port == 0:
        taken = GrpcPortTaken(address)
        log.error("attnserve cannot start: %s", taken)
        raise taken
    methods = InferenceService(engine).methods()
    server.add_generic_rpc_handlers((calls.generic_handler(engine, SERVICE, methods, port),))
    health_service = ReadinessHealth(engine)
    await health_service.refresh()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
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
