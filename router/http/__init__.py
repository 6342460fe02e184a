"""The HTTP surface's wire format, the bottom of `router/`: the error JSON every endpoint answers
with (`errors.py`), the request bodies' schemas (`schemas.py`), what a body may be (content type,
deadline: `body_limits.py`), the published OpenAPI schema (`openapi.py`), the 404 that lists the
endpoints (`not_found.py`) and uvicorn's protocol with head limits (`protocol.py`). It knows
nothing of routing, budgets or the learning loop; everything above may use it."""
