"""The cdi node service: the kubelet DRA plugin and CDI spec writer, fed by the bus."""
