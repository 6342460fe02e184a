"""Edit a router YAML file from a command (`tune --write`, `classifier promote|rollback`).

The edited document is validated as a whole (environment overrides included, on a copy: their
values never reach the file) before the file is replaced, and it is replaced atomically: written
beside it, then renamed over it, so a proxy watching the file (router/proxy/reload.py) never reads
half of it. YAML comments are not kept (PyYAML does not keep them).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from router.config import RouterConfig, config_from_dict
from trace_format.config_base import ConfigError


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one step (same folder, then os.replace), keeping its mode."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def edit_config(path: str | Path, edit: Callable[[dict[str, Any]], None]) -> RouterConfig:
    """Apply `edit` to the YAML document at `path`, validate, replace the file atomically; returns
    the validated config. Raises ConfigError naming the key (the file is then unchanged)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    edit(data)
    config = config_from_dict(data, source=str(p))
    write_atomically(p, yaml.safe_dump(data, sort_keys=False).encode())
    return config
