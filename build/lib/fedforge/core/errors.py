"""Errors a user can cause. Each message names the bad value and what is allowed."""

from __future__ import annotations

import reprlib
import signal


class FedforgeError(Exception):
    """Base of every error fedforge raises on purpose (bad config, data, upload...)."""


class ConfigError(FedforgeError):
    """A configuration value is missing, of the wrong type or out of range."""


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 6
_SHORT.maxlevel = 3


def shown(value: object) -> str:
    """``repr(value)`` cut short: a message quotes a bad value, never a whole file
    (a few YAML aliases can nest a list into gigabytes of text)."""
    try:
        text = _SHORT.repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        size = (
            f" of about {value.bit_length() * 0.30103:.0f} digits" if isinstance(value, int) else ""
        )
        text = f"<{type(value).__name__}{size}, too long to print>"
    return text if len(text) <= 200 else text[:197] + "..."


def invalid_field(name: str, value: object, allowed: str) -> ConfigError:
    """The error for config field ``name`` holding ``value``: says what is allowed."""
    return ConfigError(f"config field '{name}' = {shown(value)} is invalid: {allowed}")


class DataError(FedforgeError):
    """A data set cannot be found, downloaded, or fails its checksum."""


class PartitionError(ConfigError):
    """Partition parameters that cannot produce a valid partition."""


class UploadError(FedforgeError):
    """A message on the wire (payload or update) is malformed."""


class Withheld(UploadError):
    """The client's own gate kept its update back: refused, but no fault."""


class ProtocolError(FedforgeError):
    """A protocol message the protocol forbids (e.g. a secure-aggregation server
    asking a client twice, or listing too few clients): the client aborts the
    round and the server counts it as a dropout."""


class StoreError(FedforgeError):
    """The run store cannot be read or written."""


class EngineError(FedforgeError):
    """Client work could not be run (e.g. a worker process died)."""


class AggregationError(FedforgeError):
    """An aggregator cannot combine the updates it was given (e.g. Krum with
    fewer than 2f + 3 of them)."""


class StopNow(KeyboardInterrupt):
    """A second SIGINT/SIGTERM during a run: it stops at once, mid-round; the run
    resumes from its last checkpoint (``run_dir``: where, once the loop knows)."""

    def __init__(self, signum: int, run_dir: object = None) -> None:
        self.signum, self.run_dir = signum, run_dir
        super().__init__(signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def __str__(self) -> str:
        name = self.signal_name
        where = f"fedforge resume {self.run_dir}" if self.run_dir else "fedforge resume RUN"
        return f"stopped at once by a second {name}; resume from the last checkpoint with: {where}"


# (field, value, ok, allowed): one check of a config field
FieldCheck = tuple[str, object, bool, str]


def raise_first(prefix: str, checks: list[FieldCheck]) -> None:
    """Raise :func:`invalid_field` for the first failed check, its field named
    ``prefix`` + field (``prefix``: the section, e.g. ``"robust."``, or "")."""
    for name, value, ok, allowed in checks:
        if not ok:
            raise invalid_field(prefix + name, value, allowed)
