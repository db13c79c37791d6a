"""The NATS auth callout: node services prove who they are with the pod's service-account token.

nats-server hands each connection that is not a static user to this responder
(`$SYS.REQ.USER.AUTH`). `identity` asks Kubernetes who the token belongs to (a TokenReview) and
which node its pod runs on; `responder` answers with a user JWT carrying exactly that node's
permissions from `tangram.natsauth.permissions`, signed by the callout's issuer key. `python -m
services.authcallout` runs it.
"""

from services.authcallout.identity import NodeIdentity, Refused, TokenReviewer
from services.authcallout.responder import CalloutResponder

__all__ = ["CalloutResponder", "NodeIdentity", "Refused", "TokenReviewer"]
