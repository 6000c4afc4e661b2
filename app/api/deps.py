"""Typed dependencies for the FastAPI routes of the control plane."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.services import Services


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def require_admin(request: Request, services: ServicesDep) -> None:
    """Admin endpoints: the admin key when configured, else loopback clients only."""
    client = request.client.host if request.client else None
    services.auth.check_admin(request.headers.get("authorization"), client)


AdminDep = Depends(require_admin)
