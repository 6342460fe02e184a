"""The bottom layer: the trace record, the one trace reader, the RouteLLM CSV format, the
feedback file format, and the text a request carries. Every other package may import it; it
imports none of them."""
