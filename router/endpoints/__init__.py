"""The endpoints beside chat and completions, one module each: `admin.py` (`/admin/v1/...`),
`budget.py` (`GET /v1/budget`), `feedback.py` (`POST /v1/feedback`) and `embeddings.py`
(`POST /v1/embeddings`, unrouted). Each is a thin HTTP layer over a library below it."""
