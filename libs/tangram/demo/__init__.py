"""`tangram demo`: the services as separate processes on simulated GPUs, with an embedded NATS."""
