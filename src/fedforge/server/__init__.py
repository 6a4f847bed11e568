"""The server: the round in phases, its collectors, the run loop and its store, server optimizers, the engine probe."""
