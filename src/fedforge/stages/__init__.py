"""Pipeline stages: codecs (the client's last step and the server's first), and
later clipping, DP noise, compression, secure aggregation and validation."""

from fedforge.stages.codec import Codec, Dense

__all__ = ["Codec", "Dense"]
