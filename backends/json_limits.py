"""How deep a JSON document we accept, from a client or an upstream.

orjson parses 1024 levels but serialises only 254: a deeper document parsed fine and then failed
when re-serialised (a client's body on its way upstream, an upstream's answer on its way to the
client), after the budget was reserved. Real requests and answers stay far below 64 levels, tool
schemas included.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64


def deeper_than(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when `value` has containers nested more than `limit` deep. No recursion: the value
    may be 1000 deep."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False
