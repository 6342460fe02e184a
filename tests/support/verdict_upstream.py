"""A scripted judge model: an OpenAI-compatible server (real HTTP, uvicorn in a thread) whose
answers to judge prompts follow a rule the test picks, so judge tests know the right verdict.

Modes (`server.mode`, changeable between requests):
- ``prefer``: the answer containing `marker` wins (`[[A]]`/`[[B]]`, `[[C]]` when neither or both);
  in single-answer prompts, `Rating: [[9]]` for it and `[[2]]` otherwise;
- ``first``: always `[[A]]` (a judge with pure position bias);
- ``garbage``: prose without a verdict.

Constraints (router/learning/judges/constrain.py): a `response_format` of type json_schema or
json_object is honoured (the verdict as `{"verdict": "A"}` / `{"grade": 9}`) and a `grammar`
too (the bare `[[A]]`), unless named in `server.refuse` ({"json_schema", "json_object",
"grammar"}): then the request is answered with `refuse_status` (422, or 500 as llama-cpp-python
answers an unknown response_format), as a server that lacks the feature does. `server.bodies`
keeps every request body.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import orjson
import uvicorn

A = re.compile(
    r"\[The Start of Assistant A's Answer\]\n(.*?)\n\[The End of Assistant A's Answer\]", re.S
)
B = re.compile(
    r"\[The Start of Assistant B's Answer\]\n(.*?)\n\[The End of Assistant B's Answer\]", re.S
)
SINGLE = re.compile(
    r"\[The Start of Assistant's Answer\]\n(.*?)\n\[The End of Assistant's Answer\]", re.S
)


class VerdictApp:
    def __init__(self, marker: str = "GOOD") -> None:
        self.mode = "prefer"
        self.marker = marker
        self.served = 0
        self.refuse: set[str | None] = set()  # None: a body without a constraint
        self.refuse_status = 422
        self.bodies: list[dict[str, Any]] = []

    def reply(self, prompt: str) -> str:
        if self.mode == "garbage":
            return "Both answers have merits; it is hard to say."
        if self.mode == "first":
            return "Assistant A is better. [[A]]"
        single = SINGLE.search(prompt)
        if single is not None:
            return f"Rating: [[{9 if self.marker in single.group(1) else 2}]]"
        a, b = A.search(prompt), B.search(prompt)
        in_a = a is not None and self.marker in a.group(1)
        in_b = b is not None and self.marker in b.group(1)
        return "[[A]]" if in_a and not in_b else "[[B]]" if in_b and not in_a else "[[C]]"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status = 200
        if scope["path"].endswith("/models"):
            payload: dict[str, Any] = {"object": "list", "data": [{"id": "judge"}]}
        else:
            body = orjson.loads(b"".join(parts))
            self.bodies.append(body)
            prompt = "".join(str(m.get("content")) for m in body.get("messages") or [])
            constraint = _constraint(body)
            if constraint in self.refuse:
                await _send(
                    send, self.refuse_status, {"error": {"message": f"unsupported: {constraint}"}}
                )
                return
            text = _constrained(self.reply(prompt), constraint)
            self.served += 1
            payload = {
                "id": "v",
                "object": "chat.completion",
                "model": "verdict",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt.split()),
                    "completion_tokens": len(text.split()),
                    "total_tokens": len(prompt.split()) + len(text.split()),
                },
            }
        await _send(send, status, payload)


async def _send(send: Any, status: int, payload: dict[str, Any]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": orjson.dumps(payload)})


def _constraint(body: dict[str, Any]) -> str | None:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        return str(fmt["type"])
    return "grammar" if body.get("grammar") else None


VERDICT = re.compile(r"\[\[(\w+)\]\]")


def _constrained(text: str, constraint: str | None) -> str:
    """The reply as a server decoding under the constraint writes it."""
    found = VERDICT.search(text)
    if constraint is None or found is None:
        return text
    verdict = found.group(1)
    if constraint == "grammar":
        return f"[[{verdict}]]"
    return orjson.dumps(
        {"grade": int(verdict)} if verdict.isdigit() else {"verdict": verdict}
    ).decode()


class VerdictServer:
    def __init__(self, marker: str = "GOOD") -> None:
        self.app = VerdictApp(marker)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> VerdictServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("verdict server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
