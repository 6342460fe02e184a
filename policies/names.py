"""The one rule for the names operators give: teams, users and API key names (labels).

A team name becomes part of Redis key names inside a Redis Cluster hash tag
(`<prefix>:{<team>}:spend`, policies/budgets/codec.py), a Prometheus label, a log field and a
table cell; a user name and a key name are stored with the key and printed by `keys list`. So one
rule, shared by the config (policies/config.py), the CLI (`cost-router keys create`) and the admin
API (`/admin/v1/...`), keeps out what would break one of them: braces (a second hash tag), `|`
(the separator of the store's fields), control characters (NUL, terminal escapes), whitespace and
unbounded length. Names starting with `__` are reserved for the router's own scopes, such as the
shadow spend's `__shadow__` (router/learning/config.py): a key or team of that name would spend
against the shadow cap.

`NAME_PATTERN` is a regex valid both in Python (`re.fullmatch`) and as a JSON-schema `pattern`
(ECMA-262), so the published OpenAPI schema states exactly what is enforced here, with
`NAME_MAX_LEN` as its `maxLength`. `KEY_ID_PATTERN` is the same for the key ids the admin calls
take (a prefix of the key's sha256).
"""

from __future__ import annotations

import re

# Long enough for an e-mail address or an SSO subject as a user name, short enough to print.
NAME_MAX_LEN = 128
# A letter or digit first (so no name starts with `_`, `-` or `.`), then letters, digits and
# `. _ @ : + -`: e-mail addresses (`ann+ci@example.com`), `org:team` and `team-1.eu` pass.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:+-]*$"
# Internal scopes: refused in every name an operator gives, whatever the pattern allows.
RESERVED_PREFIX = "__"
# What a read may name (an admin API path, `budget show --team`): a name, or a reserved one
# (`__shadow__`: its spend is shown like a team's). Length in the pattern, so it is exact alone.
TEAM_TO_READ_PATTERN = (
    rf"^(?:{RESERVED_PREFIX})?[A-Za-z0-9][A-Za-z0-9._@:+-]{{0,{NAME_MAX_LEN - 1}}}$"
)

# A key id is a prefix of its sha256 (policies/keys.py key_id_of); fewer digits would match
# too many keys.
KEY_ID_MIN_LEN = 8
KEY_ID_MAX_LEN = 64
KEY_ID_PATTERN = rf"^[0-9a-fA-F]{{{KEY_ID_MIN_LEN},{KEY_ID_MAX_LEN}}}$"

_NAME = re.compile(NAME_PATTERN)
_TEAM_TO_READ = re.compile(TEAM_TO_READ_PATTERN)
_KEY_ID = re.compile(KEY_ID_PATTERN)
# How much of a refused value an error message shows: enough to find it, never 10,000 chars.
_SHOWN = 40


def shown(value: str) -> str:
    """`value` safe to put in a message, a log line or a terminal: escaped (NUL, newlines and
    escape codes as `\\x00`, `\\n`, `\\x1b`), cut to its first characters, with its length when
    cut."""
    if len(value) <= _SHOWN:
        return ascii(value)
    return f"{ascii(value[:_SHOWN])}... ({len(value)} characters)"


def is_reserved(value: str) -> bool:
    return value.startswith(RESERVED_PREFIX)


def name_problem(value: str) -> str | None:
    """What is wrong with `value` as a name (the rule it breaks), or None when it is a name."""
    if not value:
        return "must not be empty"
    if len(value) > NAME_MAX_LEN:
        return f"must be at most {NAME_MAX_LEN} characters"
    if is_reserved(value):
        return f"must not start with {RESERVED_PREFIX!r} (reserved for internal scopes)"
    if _NAME.fullmatch(value) is None:
        return "must start with a letter or digit and contain only letters, digits and . _ @ : + -"
    return None


def check_name(kind: str, value: str) -> str:
    """`value` if it is a valid `kind` name (kind: "team", "user", "key name"); else a
    ValueError naming the kind, the rule and the value (escaped, truncated)."""
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"{kind} name {shown(value)}: {problem}")
    return value


def check_team_to_read(value: str) -> str:
    """`value` if a read may name it (TEAM_TO_READ_PATTERN); else check_name's ValueError."""
    if _TEAM_TO_READ.fullmatch(value) is not None:
        return value
    return check_name("team", value)


def check_key_id(value: str) -> str:
    """`value` if it is a key id (8 to 64 hex digits of the key's sha256), lower-cased."""
    if _KEY_ID.fullmatch(value) is None:
        raise ValueError(
            f"key id {shown(value)}: must be {KEY_ID_MIN_LEN} to {KEY_ID_MAX_LEN} hex digits "
            "of the key's sha256 (`keys list` shows them)"
        )
    return value.lower()
