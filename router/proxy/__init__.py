"""The request path: one request, step by step (`request_path.py`: identify, read, validate,
route, reserve, call the tiers, settle, trace), with its steps' helpers: the budget step
(`budget_gate.py`), each tier's in-flight limit (`limiter.py`), the classifier models requests
are scored with (`scorers.py`), the SSE relay (`stream_relay.py`), what a request is charged
(`usage_guard.py`), client hang-ups (`disconnect.py`), the state a request reads (`state.py`:
swapped whole on reload), how that state is built at startup and on a reload (`build.py`) and
the hot reload's file watch (`reload.py`)."""
