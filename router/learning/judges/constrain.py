"""Holding a judge model to a verdict it can be read by (`evaluation.judges.llm.constrain`).

A small judge model asked to end with `[[A]]` often writes something else, and an unreadable
verdict gives no label. Servers can constrain decoding instead:

- `json_schema`: OpenAI structured outputs, `response_format: {type: json_schema, json_schema:
  {name, strict, schema}}` (OpenAI and other hosted models, vLLM, llama.cpp's llama-server).
  The verdict is `{"verdict": "A"}` / `{"grade": 7}`;
- `json_object`: the same schema in llama-cpp-python's dialect, `response_format: {type:
  json_object, schema}` (its server, 0.3.x, answers `json_schema` with a validation error);
- `grammar`: a GBNF grammar in the body's `grammar` field (llama.cpp servers, llama-cpp-python
  included), forcing exactly the prompt's own format, `[[A]]` / `[[7]]`: the fewest tokens;
- `none`: free text, read in the prompt's format.

Whatever was asked for, a reply is read both ways (`read_pairwise`, `read_grade`): a server that
ignored the constraint still answers in the prompt's format. The request is what changes.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

Constraint = Literal["json_schema", "json_object", "grammar", "none"]
# `auto`: the first one the judge's server accepts. json_schema first: it is the standard, and a
# server that does not know `grammar` may ignore the field silently (vLLM) instead of refusing
# it; llama.cpp servers that refuse json_schema take the grammar.
AUTO_ORDER: tuple[Constraint, ...] = ("json_schema", "grammar", "none")

VERDICTS = ("A", "B", "C")
GRADES = tuple(range(1, 11))

_SCHEMAS: dict[str, dict[str, Any]] = {
    "pairwise": {
        "type": "object",
        "additionalProperties": False,
        "required": ["verdict"],
        "properties": {"verdict": {"type": "string", "enum": list(VERDICTS)}},
    },
    "single": {
        "type": "object",
        "additionalProperties": False,
        "required": ["grade"],
        "properties": {"grade": {"type": "integer", "enum": list(GRADES)}},
    },
}
# GBNF: the prompt's format and nothing else (the longest alternative first is not needed: the
# closing brackets end each one).
_GRAMMARS = {
    "pairwise": 'root ::= "[[" ("A" | "B" | "C") "]]"\n',
    "single": 'root ::= "[[" ("10" | [1-9]) "]]"\n',
}


def constrained(body: dict[str, Any], mode: str, how: Constraint) -> dict[str, Any]:
    """`body` with the fields that hold the reply to `mode`'s verdict (a new dict)."""
    out = dict(body)
    if how == "json_schema":
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": f"{mode}_verdict", "strict": True, "schema": _SCHEMAS[mode]},
        }
    elif how == "json_object":
        out["response_format"] = {"type": "json_object", "schema": _SCHEMAS[mode]}
    elif how == "grammar":
        out["grammar"] = _GRAMMARS[mode]
    return out


def _json_field(text: str, key: str) -> object:
    try:
        value = orjson.loads(text.strip())
    except orjson.JSONDecodeError:
        return None
    return value.get(key) if isinstance(value, dict) else None


def json_verdict(text: str) -> str | None:
    """'A', 'B' or 'C' from a structured reply (`{"verdict": "A"}`), else None."""
    value = _json_field(text, "verdict")
    if isinstance(value, str) and value.strip().upper() in VERDICTS:
        return value.strip().upper()
    return None


def json_grade(text: str) -> int | None:
    value = _json_field(text, "grade")
    # bool is an int subclass: `true` is no grade.
    if isinstance(value, int) and not isinstance(value, bool) and value in GRADES:
        return value
    return None
