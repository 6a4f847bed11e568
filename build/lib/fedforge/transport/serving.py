"""The serving model on a client's side: the model version its application uses
for inference, which the server sends (a SERVE notice) when a version is
promoted, rolled back or first made, and to each client that joins.

With ``--state-dir`` each process keeps, in that folder, one safetensors file per
version its clients serve (``serving-<IDS>-v<ID>.safetensors``: the model's named
tensors, with the version id and the round that made it as metadata) and
``serving-<IDS>.json`` (the run's config digest; client id -> version id), both
written atomically; ``<IDS>`` names the process's hosted ids, as its state file
does, so processes may share a folder. An index of another run's config is
ignored (its files removed): version ids start again in every run. A file no
client serves any more is removed. An application reads its client's model with
:func:`load_serving`. Without a state folder the versions are only logged.

Where it runs: in ``fedforge client``. What it trusts: the server it
authenticated; the tensors must fit the run's model (``ParamSpec.views``)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from fedforge.core.errors import DataError
from fedforge.core.params import ParamSpec
from fedforge.transport.client_state import save_atomic, span_of
from fedforge.transport.logs import log_event


class ServingModels:
    """The versions this process's clients serve, kept in ``folder`` (or None)."""

    def __init__(self, folder: Path | None, ids: Sequence[int], config_yaml: str) -> None:
        self.folder = folder
        self.span = span_of(ids)
        self.config_sha = hashlib.sha256(config_yaml.encode()).hexdigest()
        self.serving: dict[int, int] = {}  # client id -> version id
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        try:
            index = json.loads(self._index().read_text())
            if index.get("config_sha256") == self.config_sha:
                self.serving = {int(c): int(v) for c, v in index["clients"].items()}
            else:  # another run's: its versions are not this run's
                self._index().unlink()
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            self.serving = {}  # none yet, or unreadable: the server sends them again
        self._prune()

    def _index(self) -> Path:
        assert self.folder is not None
        return self.folder / f"serving-{self.span}.json"

    def _model(self, version_id: int) -> Path:
        assert self.folder is not None
        return self.folder / f"serving-{self.span}-v{version_id}.safetensors"

    def needs(self, client_id: int, version_id: int) -> bool:
        """Whether ``client_id`` does not serve ``version_id`` yet."""
        return self.serving.get(client_id) != version_id

    def keep(
        self,
        version_id: int,
        round_idx: int,
        params: torch.Tensor,
        spec: ParamSpec,
        clients: list[int],
    ) -> None:
        """``clients`` serve ``version_id`` (its flat ``params``, made by round
        ``round_idx``) from now on."""
        if self.folder is not None and not self._model(version_id).is_file():
            named = {n: t.contiguous().clone() for n, t in spec.views(params).items()}
            meta = {"version_id": str(version_id), "round_idx": str(round_idx)}
            save_atomic(self._model(version_id), named, meta)
        self.serving.update(dict.fromkeys(clients, version_id))
        if self.folder is not None:
            index = {str(c): v for c, v in self.serving.items()}
            tmp = self._index().with_name(f".{self._index().name}.tmp")
            with open(tmp, "w") as f:
                json.dump({"config_sha256": self.config_sha, "clients": index}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._index())
            self._prune()
        log_event("client", "serving", version=version_id, clients=sorted(clients))

    def _prune(self) -> None:
        """Remove this process's model files no client serves."""
        assert self.folder is not None
        live = {self._model(v).name for v in self.serving.values()}
        for old in self.folder.glob(f"serving-{self.span}-v*.safetensors"):
            if old.name not in live:
                old.unlink(missing_ok=True)


def load_serving(state_dir: str | Path, client_id: int) -> tuple[int, dict[str, torch.Tensor]]:
    """The model version client ``client_id`` serves, as (version id, the model's
    named tensors for ``load_state_dict``), from a client's ``--state-dir``."""
    folder = Path(state_dir)
    for index_path in sorted(folder.glob("serving-*.json")):
        try:
            clients = json.loads(index_path.read_text())["clients"]
            if str(client_id) not in clients:
                continue
            version_id = int(clients[str(client_id)])
            model = index_path.with_name(f"{index_path.stem}-v{version_id}.safetensors")
            return version_id, load_file(str(model))
        except (OSError, ValueError, TypeError, KeyError, SafetensorError) as exc:
            raise DataError(f"cannot read the serving model in '{index_path}': {exc}") from None
    raise DataError(f"client {client_id} serves no model version in '{folder}' yet")
