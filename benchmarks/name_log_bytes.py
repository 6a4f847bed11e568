"""Log bytes a deployment server writes per refused call whose sender claims a
name of a mebibyte (keys mode: an unknown name), over three calls.

    python benchmarks/name_log_bytes.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from attack_identity import hello, refusal, signed, tls_stub  # noqa: E402
from deploy_procs import start_server, write_config  # noqa: E402
from test_deployment_identity import _keys_federation  # noqa: E402

NAME_CHARS = 1 << 20


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="name-log-"))
    fed, key = _keys_federation(tmp)
    server, port = start_server(
        tmp, write_config(tmp / "cfg.yaml", num_clients=2), *("--certs", str(fed), "--auth", "keys")
    )
    try:
        stub = tls_stub(port, fed / "ca.pem")
        sizes = []
        for _ in range(3):
            before = server.log.stat().st_size
            refusal(stub.Hello, signed(key, "m" * NAME_CHARS, "Hello", hello()))
            time.sleep(0.5)  # the refusal's line is written after the answer
            sizes.append(server.log.stat().st_size - before)
    finally:
        server.kill()
    print(f"RESULT name_log_bytes_per_call={max(sizes)} name_chars={NAME_CHARS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
