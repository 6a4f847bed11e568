"""An adversarial fuzz of config loading: a few hundred mutants of the shipped
configs (wrong types, huge and non-finite numbers, unknown fields and values, deep
nesting, aliases and alias bombs, binary and non-UTF-8 bytes, empty files, a list
or scalar at the top) go through what ``fedforge run --config F`` does before it
builds the run. Each loads or raises a FedforgeError, within a time limit; nothing
else. The corpus is drawn from a fixed seed: the same mutants every run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedforge.cli import _parser, _resolve_config
from fedforge.core.errors import FedforgeError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
SECONDS_EACH = 2.0  # one mutant's limit; most take a millisecond

# YAML text put in place of a field's value
BAD_VALUES = [
    ".nan",
    ".inf",
    "-.inf",
    "1e309",
    "1.0e309",
    "-1e309",
    "-1",
    "0",
    "-0.0",
    "1e-400",
    "1" + "0" * 5000,  # past Python's digit limit for int()
    "1" + "0" * 400,  # past float's range
    "99999999999999999999",
    str(2**63),
    "0x7fffffffffffffff",
    "0o17",
    "1_000",
    "1e9",
    "1000000000",
    "null",
    "~",
    "true",
    "'yes'",
    "''",
    "'x'",
    "fedfoo",
    "2024-01-01",
    "!!binary aGVsbG8=",
    "!!float '1'",
    "!!python/object:os.system ls",
    "[1, 2]",
    "[]",
    "{}",
    "{a: 1}",
    "[[[[[[[[1]]]]]]]]",
    "[" * 60 + "]" * 60,
    "{a: " * 60 + "1" + "}" * 60,
    "*undefined",
    "&x [*x]",
    '"\\0"',
    '"\\uffff"',
    "'" + "a" * 100_000 + "'",
]

# billion laughs: nine levels of ten aliases each, 10^9 strings if expanded
BOMB = "lr: 0.1\nb0: &b0 [" + ", ".join(["lol"] * 10) + "]\n"
BOMB += "".join(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 10) + "]\n" for i in range(1, 10))

STRUCTURAL: list[bytes] = [
    b"",
    b"\n\n",
    b"# only a comment\n",
    b"---\n",
    b"---\nlr: 0.1\n---\nlr: 0.2\n",  # two documents
    b"[]\n",
    b"- lr\n- 0.1\n",
    b"42\n",
    b"'a string'\n",
    b"null\n",
    b"~\n",
    b"true\n",
    b"!!binary aGVsbG8=\n",
    b"\xff\xfe\x00\x01\x02",
    b"\x00" * 64,
    b"lr: 0.1\x00\n",
    b"\xef\xbb\xbflr: 0.1\n",  # a UTF-8 byte-order mark
    b"lr: \xc3\x28\n",  # invalid UTF-8
    b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
    b"lr:\t0.1\n\tname: x\n",
    b"? [a, b]\n: 1\n",
    b"? {a: 1}\n: 2\n",
    b"[lr]: 0.1\n",
    b"1: 2\n",
    b"null: 1\n",
    b"lr: 0.1\nlr: 0.2\n",
    b"lr: [0.1\n",
    b"lr: {\n",
    b"'unterminated\n",
    b"partition: &p {kind: iid}\nother: *p\n",
    b"partition: {<<: [*missing]}\n",
    b"base: &b {kind: iid}\npartition: {<<: *b, alpha: 0.3}\n",
    b"partition: {<<: 5}\n",
    b"partition: &p {kind: iid, again: *p}\n",
    ("lr: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
    ("lr: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n").encode(),
    ("- " * 3000 + "x\n").encode(),
    BOMB.encode(),
    ("k" * 200_000 + ": 1\n").encode(),
]


def _fields(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of every field a shipped config sets (sections included)."""
    out = []
    for key, value in data.items():
        out.append(prefix + key)
        if isinstance(value, dict):
            out += _fields(value, prefix + key + ".")
    return out


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def _with_raw(data: dict[str, Any], dotted: str, raw: str) -> bytes:
    """The config as YAML with ``dotted`` holding the YAML text ``raw``."""
    marker = "@@RAW@@"
    data = yaml.safe_load(yaml.safe_dump(data))  # a deep copy
    _set(data, dotted, marker)
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=10**9)
    return text.replace(f"'{marker}'", raw).encode("utf-8", "surrogatepass")


def mutants() -> Iterator[tuple[str, bytes]]:
    rng = random.Random(20240601)
    bases = [(p.name, p.read_text()) for p in CONFIGS]
    for i, content in enumerate(STRUCTURAL):
        yield f"structural-{i}", content
    for name, text in bases:
        data = yaml.safe_load(text) or {}
        fields = _fields(data) + ["partition.alpha", "privacy.dp", "robust.aggregator"]
        for _ in range(6):  # a bad value in a field the config sets
            field, raw = rng.choice(fields), rng.choice(BAD_VALUES)
            yield f"{name}:{field}={raw[:20]}", _with_raw(data, field, raw)
        unknown = rng.choice(["lrr", "foo", "partition.foo", "privacy.tiers.x", "local_epoch"])
        yield f"{name}:unknown {unknown}", _with_raw(data, unknown, "1")
        raw = text.encode()
        cut = rng.randrange(len(raw))
        yield f"{name}:truncated at {cut}", raw[:cut]
        flipped = bytearray(raw)
        for _ in range(3):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        yield f"{name}:bytes flipped", bytes(flipped)
        lines = text.splitlines(keepends=True)
        rng.shuffle(lines)
        yield f"{name}:lines shuffled", "".join(lines).encode()
        yield f"{name}:indented", ("  " + text.replace("\n", "\n  ")).encode()


class _Timeout(Exception):
    pass


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_every_mutant_loads_or_is_a_fedforge_error(tmp_path: Path) -> None:
    corpus = [(label, content, []) for label, content in mutants()]
    rng = random.Random(7)
    fields = ["lr", "rounds", "partition.alpha", "batch_size", "privacy.tiers.high_clients"]
    for raw in BAD_VALUES:  # the same values from the command line: --set FIELD=VALUE
        field = rng.choice(fields)
        corpus.append((f"--set {field}={raw[:20]}", CONFIGS[0].read_bytes(), [f"{field}={raw}"]))
    assert len(corpus) > 200
    path = tmp_path / "mutant.yaml"
    bad: list[str] = []
    outcomes = {"loaded": 0, "refused": 0}
    for label, content, sets in corpus:
        path.write_bytes(content)
        argv = ["run", "--config", str(path), "--runs-dir", str(tmp_path)]
        args = _parser().parse_args(argv + [f"--set={s}" for s in sets])
        try:
            with _time_limit(SECONDS_EACH):
                _resolve_config(args)
            outcomes["loaded"] += 1
        except FedforgeError as exc:
            message = str(exc)
            if "\n" in message or len(message) > 2000:
                bad.append(f"{label}: the message is not one short line: {message[:300]!r}")
            outcomes["refused"] += 1
        except _Timeout:
            bad.append(f"{label}: took more than {SECONDS_EACH} s")
        except BaseException as exc:  # noqa: BLE001 - every other exception is the finding
            bad.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
    assert not bad, "\n".join(bad)
    assert outcomes["loaded"] > 10 and outcomes["refused"] > 100, outcomes


@pytest.mark.parametrize(
    "raw, words",
    [
        (BOMB.encode(), ["expand to more than"]),
        (b"? [a, b]\n: 1\n", ["as a key"]),
        (b"\xff\xfe\x00bad", ["not UTF-8"]),
    ],
    ids=["alias-bomb", "complex-key", "binary"],
)
def test_the_command_refuses_a_mutant_in_one_line(
    tmp_path: Path, raw: bytes, words: list[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(raw)
    runs = tmp_path / "runs"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fedforge.cli", "run", "--config", str(path)]
    proc = subprocess.run(
        [*cmd, "--runs-dir", str(runs), "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedforge: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert all(w in lines[0] for w in words), lines[0]
    assert not runs.exists()
