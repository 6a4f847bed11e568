"""The character-level LSTM of McMahan et al. 2017 ("Communication-efficient learning
of deep networks from decentralized data", section 3) for Shakespeare: each input
character is embedded in a learned 8-dimensional space, the embeddings pass through
two LSTM layers of 256 units each, and the second layer's output feeds a softmax
layer with one unit per character.

Here it reads a window of characters (fedforge.data.shakespeare: 80 of them) and
returns, at every step, the logits of the character that follows the ones read so
far: a window of 80 characters trains 80 predictions. The softmax is left to the
loss (cross-entropy over the steps), as for the other models.
"""

from __future__ import annotations

import torch
from torch import nn

from fedforge.core.errors import ConfigError


def char_lstm_parameters(
    vocab_size: int, embed: int = 8, hidden: int = 256, layers: int = 2
) -> int:
    """The parameter count of :class:`CharLSTM`: the embedding table, each LSTM layer's
    four gates (input weights ``4h x in``, recurrent weights ``4h x h`` and torch's two
    bias vectors ``b_ih``, ``b_hh`` of ``4h`` each; ``in`` is ``embed`` for the first
    layer, ``hidden`` after), and the output layer's weights and bias."""
    total = vocab_size * embed
    for layer in range(layers):
        inputs = embed if layer == 0 else hidden
        total += 4 * hidden * (inputs + hidden) + 2 * 4 * hidden
    return total + hidden * vocab_size + vocab_size


class CharLSTM(nn.Module):
    """Character indices int64 ``[B, T]`` -> logits ``[B, T, vocab_size]``: at step
    ``t`` those of the character after ``x[:, : t + 1]``. Layers:
    ``nn.Embedding(vocab_size, embed)``, an ``nn.LSTM`` of ``layers`` stacked layers
    of ``hidden`` units (batch first, zero initial state), ``nn.Linear(hidden,
    vocab_size)`` on the top layer's output at every step. For vocabulary 65:
    815,945 parameters."""

    def __init__(self, vocab_size: int, embed: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        sizes = {"vocab_size": vocab_size, "embed": embed, "hidden": hidden, "layers": layers}
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"CharLSTM {name} = {value!r} is invalid: must be an int >= 1")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise ValueError(f"CharLSTM takes [batch, time] indices, got shape {tuple(x.shape)}")
        out, _ = self.lstm(self.embedding(x.to(torch.int64)))  # [B, T, hidden]
        logits: torch.Tensor = self.fc(out)
        return logits
