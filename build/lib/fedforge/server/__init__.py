"""The server: the round in phases and its collectors, the run loop, server
optimizers, the engine probe."""
