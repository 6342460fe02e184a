"""Client APIs the proxy serves besides OpenAI's own: each turns its request into the internal
chat request the shared request path routes, and the answer back (docs/agents.md)."""
