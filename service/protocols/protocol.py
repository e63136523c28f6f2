"""What ``app.py`` needs from a wire protocol, whatever its transport.

An HTTP protocol brings FastAPI routers (mounted on the app) and the OpenAPI
schemas its routes reference by hand; a protocol with a server of its own (gRPC
on its own port) brings ``serve``, entered when the engine has started and left
before it stops. Registering a protocol is one line in ``service/app.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter

from service.engine import Engine
from service.settings import Settings


def _no_components() -> dict[str, Any]:
    return {}


def _always(settings: Settings) -> bool:
    return True


@dataclass(frozen=True)
class Protocol:
    name: str
    routers: Sequence[APIRouter] = ()
    openapi_components: Callable[[], dict[str, Any]] = _no_components
    serve: Callable[[Engine], AbstractAsyncContextManager[None]] | None = None
    enabled: Callable[[Settings], bool] = _always  # a setting may turn the protocol off
