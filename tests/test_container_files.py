"""The container files agree with the code (no container runtime runs here):
every ``fedforge`` command of the Dockerfile and compose.yaml parses with the
command's own parser, the extras the image installs cover those commands, the
files and volumes they name exist, the clients hold the certificates issued and
together host every client of the config, and the image's torch is the
Makefile's, from the CPU index."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from fedforge import cli
from fedforge.config import load
from fedforge.core.extras import extra_of
from fedforge.transport.certs_cli import parse_clients
from fedforge.transport.ids import parse_ids

ROOT = Path(__file__).resolve().parents[1]


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continued lines joined), as (NAME, rest)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def _instruction(name: str) -> list[str]:
    return [rest for kind, rest in _dockerfile() if kind == name]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _commands() -> list[tuple[str, list[str]]]:
    """Every fedforge command line the files run: (where, arguments after 'fedforge')."""
    entry = json.loads(_instruction("ENTRYPOINT")[-1])
    assert entry == ["fedforge"]
    found = [("Dockerfile CMD", json.loads(_instruction("CMD")[-1]))]
    for name, service in _compose()["services"].items():
        command = service["command"]
        if service.get("entrypoint") is None:  # the image's: fedforge
            found.append((name, command))
            continue
        assert service["entrypoint"] == ["sh", "-c"], name
        words = shlex.split(" ".join(command))
        starts = [i for i, w in enumerate(words) if w == "fedforge"]
        assert starts, f"{name} runs no fedforge command"
        for i in starts:
            ends = [j for j in range(i + 1, len(words)) if words[j] in ("&&", "||", ";")]
            found.append((name, words[i + 1 : ends[0] if ends else len(words)]))
    return found


def _parse(argv: list[str]) -> Any:
    try:
        return cli._parser().parse_args(argv)
    except SystemExit as exc:  # argparse's way of refusing (or of --help: status 0)
        if argv and exc.code == 0:
            return None
        raise AssertionError(f"'fedforge {' '.join(argv)}' does not parse") from exc


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, writable) of a service's volumes."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = (source, mode != ["ro"])
    return out


def _args_of(command: str) -> list[Any]:
    return [_parse(argv) for _, argv in _commands() if argv and argv[0] == command]


def test_every_command_parses_with_the_real_parser() -> None:
    commands = _commands()
    assert {argv[0] for _, argv in commands if argv} >= {"certs", "server", "client"}
    for where, argv in commands:
        assert argv == ["--help"] or _parse(argv) is not None, where


def test_the_image_installs_the_extras_its_commands_need() -> None:
    installs = [
        re.search(r"pip install \"?\.(?:\[([a-z,]+)\])?\"?(?:\s|$)", r) for r in _instruction("RUN")
    ]
    [package] = [m for m in installs if m is not None]  # the one that installs fedforge
    installed = set((package[1] or "").split(","))
    for where, argv in _commands():
        needed = {extra_of(m) for m in cli.NEEDS.get(argv[0], ())}
        assert needed <= installed, f"{where}: 'fedforge {argv[0]}' needs {needed}"


def test_the_image_copies_what_exists_and_ignores_the_rest() -> None:
    for copy in _instruction("COPY"):
        *sources, _ = copy.split()
        for source in sources:
            assert (ROOT / source).exists(), source
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored  # .venv, runs and data never enter the build context
    assert {"!pyproject.toml", "!src/"} <= set(ignored)


def test_the_image_torch_is_the_makefiles_from_the_cpu_index() -> None:
    pinned = re.findall(r'"torch==([\d.]+)"', (ROOT / "Makefile").read_text())
    [torch] = [r for r in _instruction("RUN") if "torch==" in r]
    assert re.search(r"torch==([\d.]+)", torch)[1] in pinned  # type: ignore[index]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch


def test_volumes_configs_certificates_and_clients_agree() -> None:
    compose = _compose()
    services = compose["services"]
    declared = set(compose.get("volumes") or {})
    for name, service in services.items():
        for source, _ in _mounts(service).values():
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
    [certs] = _args_of("certs")
    [server] = _args_of("server")
    clients = _args_of("client")
    certs_volume = _mounts(services["certs"])[str(certs.out)]
    assert certs_volume[1], "certs must write its folder"
    issued = set(parse_clients(certs.clients))
    hosts = certs.hosts.split(",")
    # the server's config: a file of the checkout, mounted, that loads
    server_service = next(s for s in services.values() if s["command"][0] == "server")
    mount = next(t for t in _mounts(server_service) if str(server.config).startswith(t + "/"))
    source = _mounts(server_service)[mount][0]
    config = load(ROOT / source / server.config.relative_to(mount))
    handed = {source for source, writable in _mounts(services["certs"]).values() if writable}
    for name, service in services.items():
        if service["command"][0] in ("server", "client"):
            folder = str(_parse(service["command"]).certs)
            source, writable = _mounts(service)[folder]
            assert source in handed and source != certs_volume[0] and not writable, name
    hosted: list[int] = []
    for args in clients:
        assert args.name in issued
        host, port = args.server.rsplit(":", 1)
        assert host in services and host in hosts and int(port) == server.port
        hosted += parse_ids(args.clients)
    assert sorted(hosted) == list(range(config.num_clients))


def test_the_readme_says_how_to_build_and_start_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker build -t fedforge:cpu ." in readme
    assert "docker compose up --build" in readme


def test_the_certs_service_hands_each_service_only_what_it_needs(tmp_path: Path) -> None:
    """The certs service's shell command, run for real with its volumes as folders
    of ``tmp_path`` (and compose's ``$$`` as the shell's ``$``): the server's
    volume holds everything but ca.key and the clients' keys, each client's
    exactly ca.pem and its own certificate and key; run again, it keeps the
    certificates and hands them out again (a lost volume too)."""
    services = _compose()["services"]
    certs = services["certs"]
    command = " ".join(certs["command"]).replace("$$", "$")
    root = "/certs/"
    assert all(target.startswith(root) for target in _mounts(certs))
    command = command.replace(root, f"{tmp_path}/")
    shell = f'fedforge() {{ "{sys.executable}" -m fedforge.cli "$@"; }}; {command}'
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    volume = {
        source: tmp_path / target.removeprefix(root)
        for target, (source, _) in _mounts(certs).items()
    }
    for again in (False, True):
        done = subprocess.run(["sh", "-c", shell], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        if not again:  # a volume lost between starts is handed out again
            shutil.rmtree(volume["client-1-certs"])
    ca = (volume["fed"] / "ca.pem").read_bytes()
    assert (volume["client-1-certs"] / "ca.pem").read_bytes() == ca  # the same CA kept

    def files(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    # the image makes each of those folders its user's, so an empty volume
    # mounted there is writable by it (one the image lacks would be root's)
    [made] = [r for r in _instruction("RUN") if "useradd" in r]
    owned = re.search(r"chown -R fedforge:fedforge ([^&]+)", made)
    assert owned is not None
    for target in _mounts(certs):
        assert f" {target}" in f" {made}" and any(target.startswith(o) for o in owned[1].split()), (
            target
        )
    everything = files(volume["fed"])
    assert {"ca.key", "clients/client-0.key", "server.key"} <= everything
    for name, service in services.items():
        if service["command"][0] not in ("server", "client"):
            continue
        args = _parse(service["command"])
        held = files(volume[_mounts(service)[str(args.certs)][0]])
        if args.command == "server":
            assert held == {
                f
                for f in everything
                if f != "ca.key" and not (f.startswith("clients/") and f.endswith(".key"))
            }, name
        else:
            own = {f"clients/{args.name}.pem", f"clients/{args.name}.key"}
            assert held == {"ca.pem", *own}, name
