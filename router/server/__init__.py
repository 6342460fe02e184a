"""The running proxy: the FastAPI app that composes the endpoints over one RouterState (`app.py`),
the thin ASGI front for the hot endpoints (`asgi_front.py`), uvicorn with drain on SIGTERM
(`run.py`), the embedded demo (`demo.py`) and the port check before anything starts
(`ports.py`). This is where the parts meet; the logic of each part lives below it."""
