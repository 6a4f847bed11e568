"""Communication: codecs (quantise, sparsify, cast), error feedback, clipping, edge groups."""
