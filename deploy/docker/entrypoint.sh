#!/bin/sh
# Starts `python -m services.$SERVICE`. TANGRAM_NATS_URL_FILE names a file holding the NATS URL
# with the service's user and password (written by `tangram nats-config`), so the password
# reaches the process from a mounted Secret or host file, never from the pod spec.
set -eu
case "${SERVICE:-}" in
  # authcallout (it reads TANGRAM_NATS_URL_FILE itself) and admission ship in the allocator image
  allocator|discovery|partitioner|cdi|authcallout|admission) module="services.$SERVICE" ;;
  *) echo "tangram-entrypoint: SERVICE must be allocator, discovery, partitioner, cdi, authcallout or admission (got '${SERVICE:-}')" >&2; exit 64 ;;
esac
if [ -n "${TANGRAM_NATS_URL_FILE:-}" ]; then
  if [ ! -r "$TANGRAM_NATS_URL_FILE" ]; then
    echo "tangram-entrypoint: cannot read TANGRAM_NATS_URL_FILE $TANGRAM_NATS_URL_FILE" >&2
    exit 66
  fi
  TANGRAM_NATS_URL="$(cat "$TANGRAM_NATS_URL_FILE")"
  export TANGRAM_NATS_URL
fi
exec python -m "$module" "$@"
