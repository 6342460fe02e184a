"""What the ASGI front checks of a request before any route reads it, and the mark the server's
protocol leaves on a request it cut for arriving too slowly (router/http/protocol.py).

``json_content_type`` (``require_json`` in a route) is the CSRF guard: a browser sends a
cross-site POST without a CORS preflight only with a "simple" content type (text/plain, form
encodings) or none at all, so accepting only ``application/json`` keeps a web page from spending
a budget through a proxy that runs without auth.
"""

from __future__ import annotations

from starlette.types import Scope

from router.http.errors import RouterError

JSON_MEDIA_TYPE = b"application/json"

# Set in a request's scope["extensions"] when its body did not arrive in time: the app then sees
# a disconnect (the protocol answered 408 and closed), and records the request as a 408.
BODY_TIMEOUT = "cost_router.body_timeout"


def has_body(scope: Scope) -> bool:
    return scope["method"] in ("POST", "PUT", "PATCH")


def json_content_type(scope: Scope) -> bool:
    """True when the request declares a JSON body (`application/json`, parameters allowed)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == JSON_MEDIA_TYPE
    return False


def require_json(scope: Scope) -> None:
    """Raises the 415 unless the request declares a JSON body."""
    if not json_content_type(scope):
        raise not_json()


def not_json() -> RouterError:
    """The 415 of a request whose body is not declared JSON."""
    return RouterError(
        415, "unsupported_media_type", "Content-Type must be application/json", "content-type"
    )


def body_timed_out(scope: Scope) -> bool:
    return bool((scope.get("extensions") or {}).get(BODY_TIMEOUT))
