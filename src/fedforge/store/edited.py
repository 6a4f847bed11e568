"""A run directory's ``config.yaml`` against the config stored in its database.

``config.yaml`` is written once, beside the store, for people and tools to read;
the database's copy is the one a resume runs with. A hand-edited ``config.yaml``
is therefore not read: :func:`edited_config_note` says so, and which fields
differ, in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedforge.config import Config, load, to_dict
from fedforge.core.errors import ConfigError, shown
from fedforge.store.directory import CONFIG_NAME

_LISTED = 6  # fields named in the note; the rest are counted


def flat_fields(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted field names to values (``robust.attack``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def differing_fields(stored: Config, edited: Config) -> list[str]:
    """Dotted names of the fields whose values differ, as ``field: stored -> edited``."""
    old, new = flat_fields(to_dict(stored)), flat_fields(to_dict(edited))
    return [
        f"{name}: {shown(old.get(name))} -> {shown(new.get(name))}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def edited_config_note(run_dir: Path, stored: Config) -> str | None:
    """One line when ``run_dir``'s config.yaml no longer matches the stored config
    (edited, unreadable or removed); None when it matches."""
    path = Path(run_dir) / CONFIG_NAME
    used = "the config stored in the run is the one used (edits to it are not read)"
    if not path.is_file():
        return f"'{path}' is missing; {used}"
    try:
        edited = load(path)
    except ConfigError as exc:
        return f"'{path}' differs from the stored config and does not load ({exc}); {used}"
    diff = differing_fields(stored, edited)
    if not diff:
        return None
    more = f", and {len(diff) - _LISTED} more" if len(diff) > _LISTED else ""
    return (
        f"'{path}' differs from the stored config in {len(diff)} field"
        f"{'s' if len(diff) > 1 else ''} ({'; '.join(diff[:_LISTED])}{more}); {used}"
    )
