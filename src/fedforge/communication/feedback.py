"""Error feedback: each client keeps what compression dropped and adds it to its
next update (Seide et al. 2014, "1-bit SGD"; Stich et al. 2018, "Sparsified SGD
with memory"; Karimireddy et al. 2019, "Error feedback fixes SignSGD").

With residual e (zero at first) and codec C, a client sending delta d computes
v = d + e, sends C(v), and keeps e' = v - decode(C(v)): exactly what the server
will not see. Over any number of rounds, the sum of what was sent plus the last
residual is the sum of the deltas (mass is conserved; exactly so when the
arithmetic is, e.g. top-k on values with few significant bits).

The residual is persistent per-client state, a row of a
:class:`~fedforge.store.ClientStateStore` (memory or memmap), which checkpoints
save, so a resumed run continues with the same residuals. It is taken after
clipping and DP noise (DESIGN idea 2), just before encoding. Runs on the client;
in simulation the store lives beside the server's loop state. It wraps any codec.
"""

from __future__ import annotations

import torch

from fedforge.core.errors import UploadError
from fedforge.core.params import all_finite
from fedforge.pipeline.codec import CodecContext, Encoded
from fedforge.pipeline.pipeline import Codec
from fedforge.store.client_state import ClientStateStore


class ErrorFeedback:
    """A codec with memory: encodes delta + residual and keeps the new residual."""

    def __init__(self, codec: Codec, store: ClientStateStore) -> None:
        self.codec = codec
        self.store = store
        self.name = f"{codec.name}+ef"
        self.linear = codec.linear
        self.lossy = codec.lossy
        self.constraints = codec.constraints
        self.decode = codec.decode  # what was sent is the wrapped codec's encoding

    def encode(self, delta: torch.Tensor, ctx: CodecContext | None = None) -> Encoded:
        if ctx is None or ctx.client_id is None:
            raise ValueError("error feedback keeps a residual per client: it needs a client id")
        cid = ctx.client_id
        v = delta + self.store.gather([cid])[0].to(delta.dtype)
        tensors, meta = self.codec.encode(v, ctx)
        try:
            sent = self.codec.decode(tensors, meta, v.numel(), v.dtype, ctx)
        except UploadError:  # e.g. a NaN scale of a diverged update: the server
            return tensors, meta  # refuses the message; the residual stays as it was
        residual = v - sent
        if all_finite(residual):
            self.store.scatter([cid], residual.unsqueeze(0))
        # else: a local run that blew up keeps its old residual. Its update is
        # refused by the server; a NaN residual would poison every later round.
        return tensors, meta
