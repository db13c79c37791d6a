"""Tangram on one machine, for development, tests and benchmarks; never deployed.

The embedded nats-server (`natsserver`), Tangram's services as local processes on simulated GPUs
(`processes`), the kubelet stand-in that prepares pods' claims through the DRA socket (`kubelet`),
`tangram cluster up` (`clusterup`), the Kubernetes control plane and Helm built from their Go
modules (`controlplane`, `helm`, sharing one build cache: `gobuild`), and the Prometheus
Operator's CRDs taken from its Go module into that cache (`monitoringcrds`). Product code never
imports this package (an import-linter contract).
"""
