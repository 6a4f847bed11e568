"""The README's deployment example, run as it stands: its shell blocks are read
from README.md itself and run by bash in a temporary folder, as a user who
copies them would, with real ``fedforge certs``, ``server`` and ``client``
processes on loopback.

The only changes made to the text, all mechanical:

- ``fedforge`` is a shell function running ``python -m fedforge.cli`` with this
  interpreter (the checkout under test, not whatever is on PATH);
- the ports 50051 and 9100 become free ones (other tests may hold them);
- ``runs/RUN`` becomes the run folder the example made (the README's placeholder);
- ``configs/`` in the temporary folder is a link to the repository's;
- a bare ``wait`` waits for each background job in turn and fails with the
  first that failed (bash's own ``wait`` returns 0 whatever its jobs did).

The ``--resume`` line is not run: it is for a crashed server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from deploy_sim import free_port
from fedforge.report.runs import run_row
from fedforge.store.runstore import RunStore
from fedforge.systems import read_profiles

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## A federation over the network"
WAIT_EACH = "for job in $(jobs -p); do wait $job || exit $?; done"


def shell_blocks(readme: str, section: str) -> list[str]:
    """The ```sh blocks of one ``## `` section, in order, their lines joined
    where a backslash continues them."""
    start = readme.index(section)
    end = readme.find("\n## ", start + len(section))
    body = readme[start : end if end >= 0 else None]
    blocks = re.findall(r"```sh\n(.*?)```", body, flags=re.S)
    return [b.replace("\\\n", " ") for b in blocks]


def run_bash(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    prelude = f'fedforge() {{ "{sys.executable}" -m fedforge.cli "$@"; }}\n'
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        ["bash", "-c", prelude + script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its background jobs are in its process group
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"the README's commands did not finish in {timeout} s:\n{out}"
        ) from late
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_the_readme_deployment_example_runs_as_written(tmp_path: Path, mnist_dir: Path) -> None:
    blocks = shell_blocks((ROOT / "README.md").read_text(), SECTION)
    assert len(blocks) >= 2, "the section shows the example, then what follows a run"
    example = blocks[0]
    for command in ("fedforge certs", "fedforge server --config", "fedforge client"):
        assert command in example
    grpc_port, metrics_port = free_port(), free_port()
    example = example.replace("50051", str(grpc_port)).replace("9100", str(metrics_port))
    example = re.sub(r"^wait\b", WAIT_EACH, example, flags=re.M)
    (tmp_path / "configs").symlink_to(ROOT / "configs")

    done = run_bash(example, tmp_path, timeout=150)
    assert done.returncode == 0, done.stdout
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 1, done.stdout
    with RunStore.open(runs[0], read_only=True) as store:
        assert store.status == "finished", done.stdout
        config = store.config()
        assert len(store.rounds()) == config.rounds

    with RunStore.open(runs[0], read_only=True) as store:  # `fedforge runs` says who ran it
        assert run_row(store.info())[3] == "deployment"

    after = [line for line in blocks[1].splitlines() if "fedforge models list" in line]
    assert after, "the README shows how to list the run's model versions"
    listed = run_bash(after[0].replace("runs/RUN", f"runs/{runs[0].name}"), tmp_path, 60)
    assert listed.returncode == 0, listed.stdout

    profile = [line for line in blocks[1].splitlines() if "fedforge profile" in line]
    assert profile, "the README shows how to profile the run's clients"
    done = run_bash(profile[0].replace("runs/RUN", f"runs/{runs[0].name}"), tmp_path, 60)
    assert done.returncode == 0, done.stdout
    assert len(read_profiles(tmp_path / "pop.csv", config.num_clients)) == config.num_clients
