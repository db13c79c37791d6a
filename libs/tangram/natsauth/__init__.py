"""NATS authorization, in one place: who may publish and subscribe to what (`permissions`: the
per-node users, the server's authorization block), the JWTs the auth callout issues (`jwt`), and
the credential files `tangram nats-config` writes (`credentials`). The callout service itself is
`services/authcallout`."""
