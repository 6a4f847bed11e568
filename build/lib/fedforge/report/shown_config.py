"""A run's config as the report, ``compare`` and the exports show it: rebuilt
and written out in full (every default filled in), or, when this fedforge
cannot rebuild it (a key or value of a newer version), the stored JSON as it
is, with why. Either way each alert rule's URL and command are cut to what
does not carry a secret (:func:`fedforge.config.alerts.redact_alerts`): a page
or an export is shared, the run directory is not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from fedforge.config import from_dict, to_dict
from fedforge.config.alerts import redact_alerts
from fedforge.core.errors import ConfigError
from fedforge.store.runstore import RunStore


@dataclass(frozen=True)
class ShownConfig:
    """The config's plain data, redacted, and why it is the stored data as it is
    (None: rebuilt by this fedforge)."""

    data: dict[str, Any]
    problem: str | None = None

    def get(self, dotted: str) -> Any:
        """A setting by its dotted name (``privacy.dp``); None when absent."""
        value: Any = self.data
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    @property
    def yaml(self) -> str:
        return yaml.safe_dump(self.data, sort_keys=False, allow_unicode=True)

    @property
    def note(self) -> str | None:
        """The sentence a reader gets when the config could not be rebuilt."""
        if self.problem is None:
            return None
        return (
            f"This fedforge cannot rebuild the run's config ({self.problem}); it is shown "
            "as stored, and the settings above are read from it by name."
        )


def shown_config(store: RunStore) -> ShownConfig:
    """The run's config to show; a store whose config is not a JSON object is
    refused (StoreError), as reading it anywhere else is."""
    data = store.config_data()
    try:
        full = to_dict(from_dict(data))
    except (ConfigError, ValueError, TypeError) as exc:
        return ShownConfig(redact_alerts(data), " ".join(str(exc).split()))
    return ShownConfig(redact_alerts(full))
