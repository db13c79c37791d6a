"""Tangram: a Kubernetes DRA driver for NVIDIA GPUs built as services over NATS JetStream."""

__version__ = "0.1.0"
DRIVER_NAME = "gpu.tangram.dev"
