"""The learning loop, off the request path: shadow comparisons (`shadow.py`, `shadow_log.py`),
the judges that turn answers into labels (`judges/`), stored user feedback (`feedback.py`), the
`evaluation:` section (`config.py`) and, on its training side, promotion and rollback of
classifier models (`promotion.py`). It never imports the HTTP surface, the request path or the
commands (`lint-imports`); the request path never imports its training side."""
