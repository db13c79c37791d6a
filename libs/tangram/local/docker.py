"""Docker for the local development stack (docker-compose.yml): the compose plugin built from its Go
module, a base image made from Debian's own packages, and a Docker engine started when none runs.

Debian packages the Docker engine (`docker.io`) but not the compose plugin, and images from Docker
Hub cannot be reached from every machine; so, like Helm (`tangram.local.helm`):

- the compose plugin is built once from github.com/docker/compose/v5 into the Go build cache
  (`tangram.local.gobuild`) and offered to the docker CLI through a DOCKER_CONFIG folder of its
  own (`docker_config()`), leaving the user's ~/.docker alone;
- the base image Tangram's Dockerfile builds on (BASE_IMAGE) is made with mmdebstrap from Debian
  bookworm (Python 3.11) and `docker import`ed, tagged by its recipe. It trusts the CA
  certificates the host trusts, so that pip in the image build reaches the package index through
  whatever TLS proxy the host's own pip goes through.

`python -m tangram.local.docker build` builds the plugin when missing and prints its path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tangram.local.gobuild import build_once, cache_root, module_dir, tool_main
from tangram.local.launch import end_process

COMPOSE_VERSION = "v5.6.0"
COMPOSE_MODULE = "github.com/docker/compose/v5"
# what compose's own release build stamps: `docker compose version` names the release
_LDFLAGS = f"-s -w -X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}"
# measured: under a minute on a 2-core machine with the module cache warm, a few cold
_COLD_BUILD_HINT = "a few minutes the first time (module download and compile)"

BASE_SUITE = "bookworm"  # Python 3.11, the oldest Tangram supports
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

DAEMON_START_S = 60.0
DAEMON_STOP_S = 30.0


class DockerError(RuntimeError):
    """Docker cannot be used here, or a build or command failed; the message says which and why."""


def compose_binary_path() -> Path:
    """`<cache>/compose/<version>-<hash of the link flags>/docker-compose`: changed flags build anew."""
    digest = hashlib.sha256(f"{COMPOSE_MODULE}@{COMPOSE_VERSION} {_LDFLAGS}".encode()).hexdigest()[:12]
    return cache_root("compose") / f"{COMPOSE_VERSION}-{digest}" / "docker-compose"


def build_compose(*, out: Any = sys.stderr) -> Path:
    """Build the compose plugin into its cache directory unless it is there already.

    `go install module@version` refuses compose (its go.mod has exclude directives), so it is
    built inside its own module's source, where those directives apply as its release build's do.
    """
    path = compose_binary_path()
    if path.exists():
        return path
    source = module_dir(COMPOSE_MODULE, COMPOSE_VERSION, error=DockerError, work=cache_root("compose"))
    return build_once(
        path,
        lambda staging: [
            "build",
            "-trimpath",
            f"-ldflags={_LDFLAGS}",
            "-o",
            str(staging / path.name),
            "./cmd",
        ],
        what=f"docker compose {COMPOSE_VERSION}",
        hint=_COLD_BUILD_HINT,
        error=DockerError,
        cwd=source,
        # the module's source is Go's read-only cache: never let the build try to tidy it
        env={"CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"},
        out=out,
    )


def docker_config() -> Path:
    """A DOCKER_CONFIG folder whose only CLI plugin is the compose build: `docker compose` then
    runs that build whatever the machine has installed. Never builds."""
    binary = compose_binary_path()
    if not binary.exists():
        raise DockerError(f"the compose plugin {binary} is not built yet: run `make docker`")
    folder = cache_root("compose") / "docker-config"
    plugins = folder / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.is_symlink() or link.readlink() != binary:
        staging = plugins / f".docker-compose.{os.getpid()}"
        staging.unlink(missing_ok=True)
        staging.symlink_to(binary)
        staging.replace(link)
    return folder


def client_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """The environment of a docker command that uses the compose build."""
    return {**os.environ, "DOCKER_CONFIG": str(docker_config()), **extra}


def docker(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600.0) -> str:
    """One docker command; its standard output, or DockerError with both outputs."""
    command = ["docker", *args]
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=dict(env) if env is not None else client_env(),
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as error:
        raise DockerError(f"no docker command on PATH ({error}): run `make docker`") from error
    except subprocess.TimeoutExpired as error:
        raise DockerError(f"{' '.join(command)} did not finish within {timeout:g} s") from error
    if result.returncode != 0:
        raise DockerError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def engine_version() -> str | None:
    """The version of the Docker engine the docker CLI reaches (DOCKER_HOST, else the default
    socket); None when none answers."""
    if shutil.which("docker") is None:
        return None
    result = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


@contextmanager
def running_engine(workdir: Path) -> Iterator[str]:
    """A Docker engine for the duration, and its version: the one that answers, else `dockerd`
    started here (it needs root, as every dockerd without rootless setup does) and stopped on the
    way out. Its images and build cache stay in dockerd's data root for the next run."""
    version = engine_version()
    if version is not None:
        yield version
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerError("no Docker engine answers and dockerd is not installed: run `make docker`")
    if os.geteuid() != 0:
        raise DockerError("no Docker engine answers, and starting dockerd here needs root")
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "dockerd.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [dockerd, "--pidfile", str(workdir / "dockerd.pid")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + DAEMON_START_S
        while (version := engine_version()) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise DockerError(f"dockerd did not start (see {log_path}): {' | '.join(tail)}")
            time.sleep(0.5)
        yield version
    finally:
        end_process(process, timeout=DAEMON_STOP_S)


def base_image_tag() -> str:
    """`tangram-base:<suite>-<hash of the recipe and the host's CA bundle>`."""
    recipe = f"{BASE_SUITE} {' '.join(BASE_PACKAGES)}".encode()
    digest = hashlib.sha256(recipe + _host_ca_bundle()).hexdigest()[:12]
    return f"tangram-base:{BASE_SUITE}-{digest}"


def base_image(*, out: Any = sys.stderr) -> str:
    """The base image's tag, made with mmdebstrap and imported unless the engine has it already."""
    tag = base_image_tag()
    if _has_image(tag):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise DockerError("mmdebstrap is not installed (Debian's package): run `make docker`")
    print(f"making the base image {tag} from Debian {BASE_SUITE} (about half a minute)", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="tangram-base-") as folder:
        tarball = Path(folder) / "rootfs.tar"
        command = [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            f'--customize-hook=cp {HOST_CA_BUNDLE} "$1{HOST_CA_BUNDLE}"',
            BASE_SUITE,
            str(tarball),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = " | ".join(result.stderr.strip().splitlines()[-5:])
            raise DockerError(f"mmdebstrap of {BASE_SUITE} failed ({result.returncode}): {tail}")
        docker(["import", str(tarball), tag], env=os.environ)
    return tag


def _has_image(tag: str) -> bool:
    result = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def _host_ca_bundle() -> bytes:
    try:
        return HOST_CA_BUNDLE.read_bytes()
    except OSError as error:
        raise DockerError(f"cannot read the host's CA certificates {HOST_CA_BUNDLE}: {error}") from error


def main(argv: list[str] | None = None) -> int:
    return tool_main(
        argv,
        prog="tangram.local.docker",
        commands={"build": lambda: [build_compose()]},
        errors=(DockerError, OSError),
    )


if __name__ == "__main__":
    sys.exit(main())
