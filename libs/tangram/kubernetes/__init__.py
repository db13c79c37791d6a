"""Kubernetes, in two halves: `objects` builds and judges API objects as plain dicts (pure: slices,
DeviceClasses, whose claims and classes are Tangram's, the scheduling gate, the claim bridge's
rules, times), and `api` talks to the API server through kubernetes-asyncio (the client and its
errors, list-then-watch, Events, the slice publisher). Only `api` does I/O."""
