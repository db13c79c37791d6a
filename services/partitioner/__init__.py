"""The partitioner node service: executes MIG partition commands through NVML and reconciles at start."""
