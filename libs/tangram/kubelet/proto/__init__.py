"""Generated protobuf and gRPC stubs of the kubelet plugin APIs; regenerate with `make proto`."""
