"""The bottom layer: the trace record, the one trace reader, the RouteLLM CSV format, the
feedback file format, the text a request carries, and the base of every config section
(`config_base.py`: StrictModel, ConfigError). Every other package may import it; it
imports none of them."""
