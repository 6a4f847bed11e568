"""``fedforge dashboard`` off loopback, as real processes: it refuses plain HTTP
(the access token would cross the network readable) and serves HTTPS with a
federation's server certificate, its token cookie then marked Secure."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from fedforge.cli import main
from fedforge.core.errors import FedforgeError
from fedforge.report.dashboard.process import start_dashboard

TOKEN = "Hq3-Zr8_vN2wLx5Pc7Tb9KdE"


def test_off_loopback_the_dashboard_serves_https_or_refuses(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(FedforgeError) as refused:
        start_dashboard(runs, "--host", "0.0.0.0", "--token", TOKEN, log=tmp_path / "plain.log")
    assert "exited with status 2" in str(refused.value)
    said = (tmp_path / "plain.log").read_text().splitlines()
    assert len(said) == 1 and "--host 0.0.0.0 is not a loopback address" in said[0], said
    assert "--certs DIR" in said[0]
    fed = tmp_path / "fed"
    assert main(["certs", "--out", str(fed), "--clients", "0"]) == 0  # server.pem for 127.0.0.1
    args = ("--host", "0.0.0.0", "--token", TOKEN, "--certs", str(fed))
    with start_dashboard(runs, *args, log=tmp_path / "tls.log") as dash:
        assert dash.url.startswith("https://0.0.0.0:")
        port = urlsplit(dash.url).port
        trust = ssl.create_default_context(cafile=str(fed / "ca.pem"))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=trust, timeout=30)
        conn.request("GET", f"/api/runs?token={TOKEN}")
        answer = conn.getresponse()
        assert answer.status == 303
        assert "; Secure" in (answer.getheader("set-cookie") or "")
        answer.read()
        conn.request("GET", "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert conn.getresponse().status == 200
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.request("GET", "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
            plain.getresponse()
