"""The ``selection:`` config section: the cohort selection policy, a registered
name (selection/named.py says its contract), and the rule that keeps a policy
other than the uniform draw away from the privacy accounting that assumes one."""

from __future__ import annotations

from dataclasses import dataclass

from fedforge.config.privacy import PrivacyConfig
from fedforge.core.errors import ConfigError

# uniform or a plugin's: a registered name (core/registry.py)
SelectionName = str
UNIFORM = "uniform"


@dataclass(frozen=True)
class SelectionConfig:
    """Which clients each round asks (its options, a plugin's, under
    ``plugin_options``; the cohort's size is ``client_fraction``'s)."""

    policy: SelectionName = UNIFORM  # uniform: C N clients without replacement

    def check(self) -> None:  # the name is checked against the registry
        return None


def policy_fits_privacy(selection: SelectionConfig, privacy: PrivacyConfig) -> None:
    """Differential privacy's accountant (its amplification by sampling), privacy
    tiers' per-client epsilons and Poisson sampling all assume each round's
    cohort is a uniform sample of rate ``client_fraction``; a policy that picks
    clients by what it knows of them breaks that."""
    if selection.policy == UNIFORM:
        return
    uses = None
    if privacy.dp != "none":
        uses = f"privacy.dp = '{privacy.dp}'"
    elif privacy.tiers.enabled:
        uses = "privacy tiers"
    elif privacy.sampling == "poisson":
        uses = "privacy.sampling = 'poisson'"
    if uses is not None:
        raise ConfigError(
            f"selection.policy = '{selection.policy}' with {uses}: the privacy accounting "
            "assumes a uniform sample of rate client_fraction each round; use "
            "selection.policy = 'uniform'"
        )
