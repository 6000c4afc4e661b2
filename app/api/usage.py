"""`GET /usage` and `GET /usage/summary`: the usage ledger (`app.store.usage`).

    GET /usage?since=2025-01-01&until=2025-01-31&key=NAME&group_by=model|key|route|day
    GET /usage/summary          per key: today and the last 7 days (the page's panel)

Days are UTC, `since` and `until` inclusive (none: unbounded). Each row: the group's
value, `requests`, `prompt_tokens`, `completion_tokens`, `cloud_tokens` (tokens answered by
a cloud provider); by route also `cloud` and `cost` (from the provider's `cost_per_mtok`;
None without one). The summary gives per key `local_tokens`, `cloud_tokens`, `cost` and
`cost_complete` (false when a provider used has no price).

Who may read: the admin (as every admin route), or a client key, which reads only its own
rows (a `key=` naming another is refused, 403). Without client keys, admin only.
"""

from __future__ import annotations

import datetime
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from app.api.deps import ServicesDep, plane_of, require_admin
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from app.services import Services
from app.store.base import UsageQuery

router = APIRouter(tags=["ops"])

GroupBy = Literal["model", "key", "route", "day"]


def reader_scope(request: Request, services: Services) -> str | None:
    """The client key's name when a client key reads (its own rows only); None for the
    admin. Anything else: the admin check's 401 or 403."""
    auth = plane_of(request).auth
    header = request.headers.get("authorization")
    if auth.keys.anonymous is None and header:
        try:
            return auth.check_client(header).name
        except AuthenticationFailed:
            pass  # not a client key: perhaps the admin's
    require_admin(request, services)
    return None


@router.get("/usage")
async def usage(
    request: Request,
    services: ServicesDep,
    since: datetime.date | None = None,
    until: datetime.date | None = None,
    key: Annotated[str | None, Query(max_length=256)] = None,
    group_by: GroupBy = "model",
) -> dict[str, Any]:
    own = reader_scope(request, services)
    if own is not None:
        if key is not None and key != own:
            raise PermissionDenied("A client key may read only its own usage.")
        key = own
    if since is not None and until is not None and since > until:
        raise InvalidRequest("since is after until", param="since")
    query = UsageQuery(
        since=None if since is None else since.isoformat(),
        until=None if until is None else until.isoformat(),
        key=key,
        group_by=group_by,
    )
    rows = await services.usage.usage(query)
    totals = {
        name: sum(row[name] for row in rows)
        for name in ("requests", "prompt_tokens", "completion_tokens", "cloud_tokens")
    }
    return {
        "since": query.since,
        "until": query.until,
        "key": key,
        "group_by": group_by,
        "rows": rows,
        "totals": totals,
    }


@router.get("/usage/summary")
async def summary(request: Request, services: ServicesDep) -> dict[str, Any]:
    own = reader_scope(request, services)
    return await services.usage.panel(time.time(), key=own)
