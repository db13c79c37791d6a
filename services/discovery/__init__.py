"""The discovery node service: reads the node's GPUs through NVML and publishes its inventory."""
