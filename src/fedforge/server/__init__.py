"""The server: round loop, server optimizers, client selection."""
