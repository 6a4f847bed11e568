"""The client: its runtime (one picklable task) and local-training kernels."""
