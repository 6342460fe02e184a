"""Conversations: who a request's session is (identity.py), what a session mode does with the
policy's decision (modes.py), and where a session's state lives (store.py, redis.py + session.lua).
docs/conversations.md."""
