"""Admission: pods that use Tangram's claims are held by a scheduling gate until Tangram's
allocator has written their claims' allocation.

`python -m tangram.admission` is a small mutating webhook: `review` parses the API server's
AdmissionReview and builds the JSONPatch adding `tangram.k8s.names.SCHEDULING_GATE`, `lookup`
reads the pod's claims (or claim templates) and their DeviceClasses and decides with
`tangram.k8s.classes`, `certs` and `keeper` make and renew its TLS certificates (kept in a Secret,
their CA patched into the MutatingWebhookConfiguration), and `server` answers over HTTPS.
Clusters that serve MutatingAdmissionPolicy can use the chart's policy instead (deploy/README.md).
"""
