"""The practitioner's figures in one line, each part run as its own process, one
after the other, so none slows another:

- practice_dead.py: bytes recorded against bytes sent with a tenth of the client
  processes killed mid-run (target 1.00), seconds from a client's SIGKILL to its
  leaving the server's live set (target < 5);
- practice_install.py: ``fedforge --help`` seconds, the slim install's size
  (and time) against the full ``.[dev]`` one;
- practice_net.py: seconds an honest federation is blocked by 250 idle calls of
  a peer with no credentials (target 0);
- practice_robust.py: accuracy points one scaled upload costs at the default
  bound (target within 1), canary decisions one lying client flips (target 0);
- practice_waits.py: the slowest of five Joins while 600 long polls wait at the
  server (milliseconds; target under 1,000: the waits hold no thread);
- preauth_bounds.py: log lines the server writes for 2,000 forged Hellos
  (target: a few, each refusal still counted), and the most memory calls
  without credentials may hold (MiB, from the defaults).

    python benchmarks/practice.py                      # everything (~25 min here)
    python benchmarks/practice.py --install recorded   # the install figures as last
                                                       # recorded (its two venvs take
                                                       # most of the time)

Last line: ``RESULT bytes_recorded_vs_sent= dead_client_detect_s= help_s=
install_mib= idle_call_block_s= bound_attack_acc_drop= canary_flips=
join_max_ms_600_polls= forged_log_lines= preauth_mib=``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = (
    "bytes_recorded_vs_sent",
    "dead_client_detect_s",
    "help_s",
    "install_mib",
    "idle_call_block_s",
    "bound_attack_acc_drop",
    "canary_flips",
    "join_max_ms_600_polls",
    "forged_log_lines",
    "preauth_mib",
)


def _result(script: str, args: list[str] | None = None) -> dict[str, str]:
    """The ``k=v`` fields of the last line a benchmark printed."""
    done = subprocess.run(
        [sys.executable, str(HERE / script), *(args or [])],
        check=True,
        capture_output=True,
        text=True,
    )
    sys.stdout.write(done.stdout)
    last = done.stdout.strip().splitlines()[-1]
    if not last.startswith("RESULT "):
        raise SystemExit(f"{script} ended without a RESULT line: {last!r}")
    return dict(field.split("=", 1) for field in last.split()[1:])


def _recorded_install() -> dict[str, str]:
    """The newest recorded install figures (benchmarks/results/practice_install/)."""
    files = sorted((HERE / "results" / "practice_install").glob("*.json"))
    if not files:
        raise SystemExit("no recorded install figures: run with --install run")
    data = json.loads(files[-1].read_text())
    fields = data["figures"]
    print(f"install figures as recorded in {files[-1].relative_to(HERE.parent)}")
    return {k: str(v) for k, v in fields.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--install",
        choices=("run", "recorded"),
        default="run",
        help="measure the two installs now, or read the last recorded figures",
    )
    args = p.parse_args(argv)
    fields = {
        **_result("practice_dead.py"),
        **(_result("practice_install.py") if args.install == "run" else _recorded_install()),
        **_result("practice_net.py"),
        **_result("practice_robust.py"),
    }
    waits = _result("practice_waits.py", ["--waiting", "600"])
    fields["join_max_ms_600_polls"] = waits["waiting"].split(":")[1].split("/")[1]
    preauth = _result("preauth_bounds.py", ["--calls", "2000"])
    fields["forged_log_lines"] = preauth["log_lines"]
    fields["preauth_mib"] = preauth["pending_mib_total"]
    print("RESULT " + " ".join(f"{k}={fields[k]}" for k in ORDER))
    return 0


if __name__ == "__main__":
    sys.exit(main())
