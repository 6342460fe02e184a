"""The proxy's endpoints, one module each: `openai.py` (`/v1/chat/completions`,
`/v1/completions`, `/v1/embeddings`, `/v1/models`), `embeddings.py` (the embeddings steps,
unrouted), `admin.py` (`/admin/v1/...`), `budget.py` (`GET /v1/budget`), `feedback.py`
(`POST /v1/feedback`) and `ops.py` (`/healthz`, `/readyz`, `/metrics`). Each is a thin HTTP
layer over a library below it."""
