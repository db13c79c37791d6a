#!/bin/sh
# Starts `python -m services.$SERVICE`, or with SERVICE=nats the NATS server of the image's
# `embedded` extra with the container's arguments (docker-compose.yml's cluster).
# TANGRAM_NATS_URL_FILE names a file holding the NATS URL with the service's user and password
# (written by `tangram nats-config`), so the password reaches the process from a mounted Secret or
# host file, never from the pod spec.
set -eu
case "${SERVICE:-}" in
  # authcallout, admission and the web view (ui) ship in the allocator image
  allocator|discovery|partitioner|cdi|authcallout|admission|ui) module="services.$SERVICE" ;;
  nats)
    if ! command -v nats-server >/dev/null 2>&1; then
      echo "tangram-entrypoint: SERVICE=nats needs an image built with the 'embedded' extra (nats-server)" >&2
      exit 69
    fi
    exec nats-server "$@" ;;
  *) echo "tangram-entrypoint: SERVICE must be allocator, discovery, partitioner, cdi, authcallout, admission, ui or nats (got '${SERVICE:-}')" >&2; exit 64 ;;
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
