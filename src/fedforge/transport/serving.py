"""The serving model on a client's side: the model version its application uses
for inference, which the server sends (a SERVE notice) when a version is
promoted, rolled back or first made, and to each client that joins.

With ``--state-dir`` each process keeps, in that folder, one safetensors file per
version its clients serve (``serving-v<ID>.safetensors``: the model's named
tensors, with the version id and the round it was made in as metadata) and
``serving.json`` (client id -> version id), both written atomically; a file no
client serves any more is removed. An application reads its client's model with
:func:`load_serving`. Without a state folder the versions are only logged.

Where it runs: in ``fedforge client``. What it trusts: the server it
authenticated; the tensors must fit the run's model (``ParamSpec.views``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file

from fedforge.core.errors import DataError
from fedforge.core.params import ParamSpec
from fedforge.transport.client_state import save_atomic
from fedforge.transport.logs import log_event

INDEX = "serving.json"


def _model_file(version_id: int) -> str:
    return f"serving-v{version_id}.safetensors"


class ServingModels:
    """The versions this process's clients serve, kept in ``folder`` (or None)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.serving: dict[int, int] = {}  # client id -> version id
        if folder is not None and (folder / INDEX).is_file():
            try:
                loaded = json.loads((folder / INDEX).read_text())
                self.serving = {int(c): int(v) for c, v in loaded.items()}
            except (OSError, ValueError, TypeError, AttributeError):
                self.serving = {}  # unreadable: the server sends them again

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
        """``clients`` serve ``version_id`` (its flat ``params``) from now on."""
        if self.folder is not None:
            path = self.folder / _model_file(version_id)
            if not path.is_file():
                named = {n: t.contiguous().clone() for n, t in spec.views(params).items()}
                meta = {"version_id": str(version_id), "round_idx": str(round_idx)}
                save_atomic(path, named, meta)
        self.serving.update(dict.fromkeys(clients, version_id))
        if self.folder is not None:
            self._save_index()
        log_event("client", "serving", version=version_id, clients=sorted(clients))

    def _save_index(self) -> None:
        assert self.folder is not None
        tmp = self.folder / f".{INDEX}.tmp"
        tmp.write_text(json.dumps({str(c): v for c, v in sorted(self.serving.items())}))
        os.replace(tmp, self.folder / INDEX)
        live = {_model_file(v) for v in self.serving.values()}
        for old in self.folder.glob("serving-v*.safetensors"):
            if old.name not in live:
                old.unlink(missing_ok=True)


def load_serving(state_dir: str | Path, client_id: int) -> tuple[int, dict[str, torch.Tensor]]:
    """The model version client ``client_id`` serves, as (version id, the model's
    named tensors for ``load_state_dict``), from a client's ``--state-dir``."""
    folder = Path(state_dir)
    try:
        index = json.loads((folder / INDEX).read_text())
        version_id = int(index[str(client_id)])
        return version_id, load_file(str(folder / _model_file(version_id)))
    except KeyError:
        raise DataError(f"client {client_id} serves no model version in '{folder}' yet") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the serving model in '{folder}': {exc}") from None
