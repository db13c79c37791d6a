"""Admission: pods that use Tangram's claims are held by a scheduling gate until Tangram's
allocator has written their claims' allocation.

`python -m services.admission` is a small mutating webhook: `review` parses the API server's
AdmissionReview and builds the JSONPatch adding the scheduling gate
(`tangram.kubernetes.objects.names.SCHEDULING_GATE`), `lookup` reads the pod's claims (or claim
templates) and their DeviceClasses and decides with `tangram.kubernetes.objects.classes`, `certs`
and `keeper` make and renew its TLS certificates (kept in a Secret, their CA patched into the
MutatingWebhookConfiguration), `server` answers over HTTPS, and `gatekeeper` removes the gate from
pods held past the gate timeout (every allocator down), so that kube-scheduler decides them and
Tangram adopts its allocation.
Clusters that serve MutatingAdmissionPolicy can use the chart's policy instead (deploy/README.md).
"""
