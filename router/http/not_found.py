"""Unknown paths under /v1 (and /admin/v1): a 404 that lists the endpoints this proxy serves.

An OpenAI client pointed at the proxy may call an endpoint it does not serve (images, audio);
the answer says which exist instead of a bare "Not Found". A known path with the wrong method
keeps its 405.
"""

from __future__ import annotations

import functools
import re

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import compile_path

from router.http.errors import error_body, json_response

not_found_router = APIRouter()

# Why an endpoint OpenAI has is not here, and what to use instead.
NOT_SERVED: dict[str, str] = {}


def served(request: Request) -> dict[str, list[str]]:
    """path template -> methods, of every endpoint the published schema (router/http/openapi.py)
    lists: what a client can call."""
    paths = request.app.openapi()["paths"]
    return {p: sorted(m.upper() for m in ops) for p, ops in paths.items()}


@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    return compile_path(template)[0]


# OPTIONS too: a path served by two routes (GET and POST /admin/v1/keys) would otherwise get
# Starlette's 405 naming only the first route's method.
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@not_found_router.api_route("/v1/{rest:path}", include_in_schema=False, methods=METHODS)
@not_found_router.api_route("/admin/v1/{rest:path}", include_in_schema=False, methods=METHODS)
async def unknown_endpoint(request: Request) -> Response:
    path = request.url.path
    routes = served(request)
    for template, methods in routes.items():  # a known endpoint, another method: 405, as before
        if _pattern(template).match(path):
            allowed = ", ".join(methods)
            message = f"{request.method} {path}: use {allowed}"
            return json_response(
                405, error_body(405, "method_not_allowed", message), {"allow": allowed}
            )
    prefix = "/admin/v1/" if path.startswith("/admin/") else "/v1/"
    listing = "; ".join(f"{' '.join(m)} {p}" for p, m in routes.items() if p.startswith(prefix))
    why = NOT_SERVED.get(path.rstrip("/"), f"no endpoint {request.method} {path}")
    return json_response(404, error_body(404, "not_found", f"{why}. This proxy serves: {listing}"))
