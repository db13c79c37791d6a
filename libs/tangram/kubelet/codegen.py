"""Regenerates the kubelet gRPC stubs from the .proto files next to them (`make proto`)."""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "proto"
# Generated imports are rooted at libs/: the stubs import each other as tangram.kubelet.proto.*.
INCLUDE_ROOT = PROTO_DIR.parents[2]


def regenerate() -> list[Path]:
    from grpc_tools import protoc  # type: ignore[import-untyped]  # noqa: PLC0415  # a development dependency

    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files in {PROTO_DIR}")
    include_files = str(Path(protoc.__file__).resolve().parent / "_proto")
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"-I{INCLUDE_ROOT}",
            f"-I{include_files}",
            f"--python_out={INCLUDE_ROOT}",
            f"--pyi_out={INCLUDE_ROOT}",
            f"--grpc_python_out={INCLUDE_ROOT}",
            str(proto.relative_to(INCLUDE_ROOT)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
    return protos


def main() -> int:
    for proto in regenerate():
        print(f"generated stubs for {proto.relative_to(INCLUDE_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
