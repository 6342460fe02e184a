"""Distillation as a lever (docs/levers.md, "Distillation"): export a set of prompts and the
teacher tier's answers from what the proxy stored (`export`), fine-tune a small student on it
(`train`, the optional `distill` extra: torch is imported there only), write it as a GGUF a
llama.cpp tier serves (`gguf_out`), and describe the result (`card`).

Nothing here is imported by the proxy: it reads trace folders and writes files.
"""
