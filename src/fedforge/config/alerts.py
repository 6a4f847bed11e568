"""The ``alerts:`` config section: rules watched after every recorded round
(fedforge.alerts), each with a kind, its threshold and what to do when it fires.

    alerts:
      rules:
        - kind: accuracy_drop      # test accuracy this many points below the best so far
          threshold: 5
          command: [notify-send, fedforge]   # argv, no shell; the alert as JSON on stdin
        - kind: client_refused     # a client's uploads refused this many times running
          threshold: 3
          url: https://hooks.example.com/fedforge   # the alert JSON POSTed

The section checks its own fields, with errors naming ``alerts.rules[i].<field>``
(``i`` counted from 0); :func:`budget_rules_need_budget` checks it against the
privacy section. A webhook URL's path and a command's arguments often carry a
secret (a token): :func:`redact_alerts` cuts them from a config shown elsewhere
(the report, the exports).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fedforge.config.ranges import Range, check_ranges
from fedforge.core.errors import FieldCheck, invalid_field, raise_first

AlertKind = Literal["accuracy_drop", "refused_rate", "client_refused", "dp_budget", "no_progress"]
ALERT_KINDS: tuple[str, ...] = (
    "accuracy_drop",
    "refused_rate",
    "client_refused",
    "dp_budget",
    "no_progress",
)
# what each kind's threshold is, as an error says it
THRESHOLDS: dict[str, str] = {
    "accuracy_drop": "a number of percentage points in (0, 100]",
    "refused_rate": "a fraction of a round's clients asked in (0, 1]",
    "client_refused": "a whole number of rounds >= 1",
    "dp_budget": "a fraction of privacy.target_epsilon in (0, 1] (default 0.9)",
    "no_progress": "a whole number of rounds >= 1",
}
DP_BUDGET_DEFAULT = 0.9
MAX_TIMEOUT = 3600.0  # seconds an action may take: the loop waits for it
TIMEOUT = Range(f"(0, {MAX_TIMEOUT:g}]", note="seconds")
MAX_NAME = 100
CUT = "…"  # what stands for the redacted part of a URL or a command


def _threshold_ok(kind: str | None, value: float | None) -> bool:
    if value is None:
        return kind == "dp_budget"  # the only kind with a default
    if not math.isfinite(value):
        return False
    if kind == "accuracy_drop":
        return 0.0 < value <= 100.0
    if kind in ("refused_rate", "dp_budget"):
        return 0.0 < value <= 1.0
    return value >= 1.0 and value == int(value)  # rounds


def _url_ok(url: str | None) -> bool:
    if url is None:
        return True
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _command_ok(command: tuple[str, ...]) -> bool:
    """A program (not empty) and its arguments; a lone item with spaces and no '/'
    is a shell line written as one string (``"notify-send done"``), refused."""
    if not command:
        return True
    shell_line = len(command) == 1 and len(command[0].split()) > 1 and "/" not in command[0]
    return bool(command[0].strip()) and not shell_line and all("\0" not in p for p in command)


@dataclass(frozen=True)
class AlertRule:
    """One rule: fires once when its condition becomes true, again only after the
    condition cleared. No action: the alert is logged and recorded only."""

    kind: AlertKind | None = None  # required: one of ALERT_KINDS
    threshold: float | None = None  # THRESHOLDS[kind]; required but for dp_budget
    name: str | None = None  # how the store and messages call it (default: the kind)
    command: tuple[str, ...] = ()  # argv, run without a shell; the alert JSON on stdin
    url: str | None = None  # http(s): the alert JSON POSTed to it
    # seconds each action may take before it counts as failed
    timeout: Annotated[float, TIMEOUT] = 10.0

    @property
    def label(self) -> str:
        """The rule's name in the store, messages and the alert JSON."""
        return self.name if self.name is not None else str(self.kind)

    @property
    def limit(self) -> float:
        """The threshold in force (dp_budget's default when none is given)."""
        return DP_BUDGET_DEFAULT if self.threshold is None else self.threshold

    def checks(self, prefix: str) -> list[FieldCheck]:
        """The rule's field checks (``prefix``: ``alerts.rules[i].``)."""
        kind = self.kind
        return [
            ("kind", kind, kind in ALERT_KINDS, "must be one of " + ", ".join(ALERT_KINDS)),
            (
                "threshold",
                self.threshold,
                _threshold_ok(kind, self.threshold),
                f"must be {THRESHOLDS.get(str(kind), 'given')} for kind {kind!r}",
            ),
            (
                "name",
                self.name,
                self.name is None or (0 < len(self.name) <= MAX_NAME and self.name.isprintable()),
                f"must be 1-{MAX_NAME} printable characters, or null (the kind)",
            ),
            (
                "command",
                list(self.command),
                _command_ok(self.command),
                "must be a list: the program, then its arguments, e.g. [notify-send, "
                "fedforge] (run without a shell: no shell line; no NUL characters)",
            ),
            ("url", self.url, _url_ok(self.url), "must be an http:// or https:// URL with a host"),
        ]


@dataclass(frozen=True)
class AlertsConfig:
    """The rules watched after every recorded round (none: no alerts)."""

    rules: tuple[AlertRule, ...] = ()

    def check(self) -> None:
        seen: set[str] = set()
        for i, rule in enumerate(self.rules):
            prefix = f"alerts.rules[{i}]."
            raise_first(prefix, rule.checks(prefix))
            check_ranges(rule, prefix)
            if rule.label in seen:
                raise invalid_field(
                    prefix + "name",
                    rule.name,
                    f"another rule is called {rule.label!r}: give each rule of a kind its own name",
                )
            seen.add(rule.label)


def budget_rules_need_budget(alerts: AlertsConfig, target_epsilon: float | None) -> None:
    """A ``dp_budget`` rule watches privacy.target_epsilon: a run without one is refused."""
    for i, rule in enumerate(alerts.rules):
        if rule.kind == "dp_budget" and target_epsilon is None:
            raise invalid_field(
                f"alerts.rules[{i}].kind",
                rule.kind,
                "needs a DP budget, privacy.target_epsilon, which this run does not set",
            )


def redacted_url(url: object) -> str:
    """``scheme://host[:port]/…``: where an alert goes, without the path, query
    or user name that may hold its secret."""
    try:
        parts = urllib.parse.urlsplit(str(url))
        host, port = parts.hostname or "", parts.port
    except ValueError:  # not a URL at all (a config this version cannot read)
        return CUT
    host = f"[{host}]" if ":" in host else host
    where = host + (f":{port}" if port is not None else "")
    return f"{parts.scheme}://{where}/{CUT}" if parts.scheme and host else CUT


def redacted_command(command: object) -> list[str]:
    """The program's file name followed by ``…``: which program, without the
    folders and arguments that may hold a secret."""
    if isinstance(command, list | tuple) and command:
        program = str(command[0]).rsplit("/", 1)[-1]
        return [program, CUT] if program else [CUT]
    return [CUT]


def redact_alerts(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config's plain data (``to_dict``'s, or a run store's config JSON, which
    may come from another version) with each alert rule's ``url`` and
    ``command`` redacted (:func:`redacted_url`, :func:`redacted_command`); the
    rest as it is."""
    out = dict(data)
    alerts = out.get("alerts")
    if alerts is None:
        return out
    rules = alerts.get("rules") if isinstance(alerts, Mapping) else None
    if not isinstance(rules, list):  # not a section this version knows: all of it
        out["alerts"] = CUT
        return out
    cut: list[Any] = []
    for rule in rules:
        if not isinstance(rule, Mapping):
            cut.append(CUT)
            continue
        rule = dict(rule)
        if rule.get("url") is not None:
            rule["url"] = redacted_url(rule["url"])
        if rule.get("command"):
            rule["command"] = redacted_command(rule["command"])
        cut.append(rule)
    out["alerts"] = {**alerts, "rules": cut}
    return out
