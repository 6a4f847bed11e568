"""Deployment: the wire format, the gRPC server and client, and their security."""
