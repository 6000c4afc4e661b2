"""Typed dependencies for the FastAPI routes of the control plane."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Final, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from app.api.protocol import json_object
from app.errors import PermissionDenied
from app.notify.notifier import LOOP_HEADER
from app.routing.plane import RoutingPlane
from app.services import Services
from app.settings.root import is_loopback

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]

PLANE_KEY: Final = "microscheduler.plane"  # the request's plane, in its ASGI scope


def plane_of(request: HTTPConnection) -> RoutingPlane:
    """The routing plane this request uses (`app.routing.plane`): the running one, read
    on the request's first ask and kept in its scope, so its key, route, cloud and
    dispatcher come from one plane whatever a reload swaps while it runs."""
    plane: RoutingPlane | None = request.scope.get(PLANE_KEY)
    if plane is None:
        services: Services = request.app.state.services
        plane = request.scope[PLANE_KEY] = services.plane
    return plane


def require_admin(request: Request, services: ServicesDep) -> None:
    """Admin endpoints: the admin key when configured, else loopback clients (naming the
    gateway in `Host`) only."""
    client = request.client.host if request.client else None
    headers = request.headers
    if headers.get(LOOP_HEADER) == services.notifier.token:
        logger.warning("a notification of this gateway came back to it, refused: a notify "
                       "target is the gateway itself path=%s", request.url.path)  # fmt: skip
        raise PermissionDenied(
            "A notification this gateway posted came back to it: a notify target is the "
            "gateway itself (by another name or through a proxy). Refused, or each post "
            "would act and notify again, in a loop."
        )
    plane_of(request).auth.check_admin(headers.get("authorization"), client, headers.get("host"))


AdminDep = Depends(require_admin)


def require_metrics_access(request: Request, services: ServicesDep) -> None:
    """`/metrics`: as admin endpoints when `Settings.metrics_admin_only`, else open (on a
    loopback listener, to a `Host` naming the gateway: no DNS rebinding)."""
    settings = services.settings
    if settings.metrics_admin_only:
        require_admin(request, services)
    elif is_loopback(settings.host) and not settings.metrics_public:
        plane_of(request).auth.check_local_read(request.headers.get("host"))


MetricsDep = Depends(require_metrics_access)


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M | None]]:
    """A dependency: the body as `model`, read as JSON whatever its content-type (so
    `curl -d '{...}'` works as printed); None for an empty body."""

    async def parse(request: Request) -> M | None:
        raw = await request.body()
        if not raw.strip():
            return None
        try:
            return model.model_validate(json_object(raw))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None

    return parse
