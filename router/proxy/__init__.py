"""The request path: one request, step by step (`request_path.py`: identify, read, validate,
route, reserve, call the tiers, settle, trace), with its steps' helpers: the budget step
(`budget_gate.py`), the SSE relay (`stream_relay.py`), what a request is charged
(`usage_guard.py`), client hang-ups (`disconnect.py`), the state a request reads
(`state.py`: swapped whole on reload) and the hot reload itself (`reload.py`)."""
