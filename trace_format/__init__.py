"""The bottom layer: the trace record, the one trace reader, the one tolerant reader of the
JSONL files appended to beside the traces (`jsonl.py`), the RouteLLM CSV format, the feedback,
label and shadow file formats, the text a request carries, the base of every config section
(`config_base.py`: StrictModel, ConfigError) and the one way to stop a background task
(`tasks.py`). Every other package may import it; it imports none of them."""
