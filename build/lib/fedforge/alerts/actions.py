"""What a rule does when it fires: run a command and/or POST to a URL, each given
the alert as JSON (:func:`alert_payload`), each within the rule's timeout.

A command runs without a shell (its argv as configured), in a session of its
own, with the alert JSON on stdin and in ``FEDFORGE_ALERT_*`` environment
variables; it is done when it exits (a child it left running in the background
is not waited for); past the timeout its whole process group is killed. Its
stderr goes to a temporary file, of which a failure's outcome quotes the last
line. A URL gets the JSON POSTed by urllib (http and https only; a redirect is
not followed: it would turn the POST into a GET, or take the alert elsewhere),
in a thread the loop waits for at most the timeout in all (name lookup,
connecting, sending, the answer). Each action's outcome is one line; a failure
is reported as such and never raised: an alert never stops a run.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from fedforge.config.alerts import AlertRule
from fedforge.store.records import AlertRecord

ENV_PREFIX = "FEDFORGE_ALERT_"
MAX_DETAIL = 200  # characters of a failing command's stderr kept in its outcome
STDERR_TAIL = 4096  # bytes of a failing command's stderr read back for it


def alert_payload(alert: AlertRecord, run_dir: Path) -> dict[str, Any]:
    """The alert as its actions get it (and as ``fedforge alerts`` can rebuild it
    from the stored row): rounds counted from 1, as everywhere a person reads them."""
    return {
        "run": run_dir.name,
        "run_dir": str(run_dir),
        "round": alert.round_idx + 1,
        "rule": alert.rule,
        "kind": alert.kind,
        "client": alert.client_id,
        "value": alert.value,
        "threshold": alert.threshold,
        "message": alert.message,
    }


def alert_env(payload: dict[str, Any]) -> dict[str, str]:
    """The payload as ``FEDFORGE_ALERT_<FIELD>`` variables (None as empty)."""
    return {
        ENV_PREFIX + key.upper(): "" if value is None else str(value)
        for key, value in payload.items()
    }


def _last_line(text: str) -> str:
    line = next((s.strip() for s in reversed(text.splitlines()) if s.strip()), "")
    return line if len(line) <= MAX_DETAIL else line[: MAX_DETAIL - 3] + "..."


def _tail(file: IO[bytes]) -> str:
    """The last line of what the command wrote to ``file`` (its last bytes read)."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - STDERR_TAIL))
    return _last_line(file.read().decode("utf-8", "replace"))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command's process group (it leads its own session), then reap it."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()  # the leader; the rest of its group was reparented and is reaped there


def run_command(argv: tuple[str, ...], body: bytes, env: dict[str, str], timeout: float) -> str:
    """Run ``argv`` with ``body`` on stdin and ``env`` added to this process's
    environment; its outcome: ``command: ok`` or ``command failed: why``."""
    with tempfile.TemporaryFile() as stderr:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, **env},
                start_new_session=True,
            )
        except OSError as exc:  # not found, not executable
            return f"command failed: {argv[0]!r} cannot run: {exc.strerror or exc}"
        with proc:
            try:  # stdin is the one pipe: this waits for the command's exit alone
                proc.communicate(body, timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return f"command failed: no exit within {timeout:g} s (killed)"
        if proc.returncode == 0:
            return "command: ok"
        detail = _tail(stderr)
    status = (
        f"killed by signal {-proc.returncode}"
        if proc.returncode < 0
        else f"exit status {proc.returncode}"
    )
    return f"command failed: {status}" + (f": {detail}" if detail else "")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is the outcome (an HTTPError), not a request elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post(url: str, body: bytes, timeout: float) -> str:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "fedforge-alerts"},
    )
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=timeout) as answer:
            return f"url: HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        return f"url failed: HTTP {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return f"url failed: {exc.reason}"
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeout, bad answer
        return f"url failed: {type(exc).__name__}: {exc}"


def post_url(url: str, body: bytes, timeout: float) -> str:
    """POST ``body`` (JSON) to ``url``; its outcome: ``url: HTTP 200`` or
    ``url failed: why``, within ``timeout`` seconds in all: the POST runs in a
    daemon thread, left to its own socket timeouts when the wait ends first."""
    outcome: list[str] = []
    thread = threading.Thread(
        target=lambda: outcome.append(_post(url, body, timeout)),
        name="fedforge-alert-url",
        daemon=True,
    )
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"url failed: no answer within {timeout:g} s"


def act(rule: AlertRule, alert: AlertRecord, run_dir: Path) -> list[str]:
    """Run the rule's actions for ``alert``: each one's outcome, in order (the
    command first); none: the alert is only logged and recorded."""
    payload = alert_payload(alert, run_dir)
    body = json.dumps(payload).encode()
    outcomes: list[str] = []
    if rule.command:
        outcomes.append(run_command(rule.command, body, alert_env(payload), rule.timeout))
    if rule.url is not None:
        outcomes.append(post_url(rule.url, body, rule.timeout))
    return outcomes
