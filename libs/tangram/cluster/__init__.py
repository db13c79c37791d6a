"""`tangram cluster up`: a real Kubernetes control plane with Tangram on simulated GPU nodes."""
