"""Files and names from people and peers: YAML loaders, fleet and trace files, claim uids."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.cdi import InvalidName, validate_claim_uid
from tangram.cli.allocate import load_fleet, load_trace
from tangram.hardware.machines import MachineError, parse_machine
from tangram.inputs import InputError, load_yaml_documents

from .strategies import FUZZ, TIMEOUT_S, json_values, text

pytestmark = pytest.mark.timeout(TIMEOUT_S)

# YAML's own punctuation, so that generated documents reach the composer and constructor.
yaml_pieces = st.sampled_from(
    [
        "- ",
        ": ",
        "\n",
        "  ",
        "[",
        "]",
        "{",
        "}",
        ", ",
        "&a ",
        "*a",
        "&b ",
        "*b",
        "!!str ",
        "!!binary ",
        "!!python/object:os.system ",
        "? ",
        "|\n  ",
        ">\n  ",
        "---\n",
        "...\n",
        "%YAML 1.1\n",
        "'",
        '"',
        "#",
        "<<: *a\n",
        "name",
        "machine",
        "count",
        "kind: ResourceClaim\n",
        "metadata",
        "spec",
        "1e999",
        "0x1F",
        "~",
        "null",
        "yes",
        "2001-12-14",
        "\t",
        "\x00",
        "\ufeff",
    ]
)
yaml_texts = st.lists(yaml_pieces | text, max_size=40).map("".join) | text


@FUZZ
@given(source=yaml_texts)
def test_yaml_loads_or_names_its_problem(source: str) -> None:
    try:
        for document in load_yaml_documents(source, "fuzz"):
            assert document.index >= 0 and document.line >= 1
    except InputError as error:
        assert str(error).startswith("fuzz")


@FUZZ
@given(source=yaml_texts | st.lists(yaml_pieces, max_size=100).map("".join), as_bytes=st.binary(max_size=64))
def test_fleet_and_trace_files_load_or_name_their_problem(source: str, as_bytes: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.yaml"
        for content in (source.encode("utf-8", "surrogatepass"), as_bytes):
            path.write_bytes(content)
            for load in (load_fleet, load_trace):
                try:
                    load(path)
                except InputError as error:
                    assert str(path) in str(error)


@FUZZ
@given(
    machine=st.dictionaries(
        st.sampled_from(["name", "gpus", "driver_version", "nvlink", "x"]) | text, json_values, max_size=5
    )
    | json_values
)
def test_a_machine_description_parses_or_names_its_problem(machine: object) -> None:
    try:
        parse_machine(machine, source="fuzz.yaml")
    except MachineError as error:
        assert "fuzz.yaml" in str(error)


SAFE_UID = re.compile(r"[0-9a-f-]{36}|[0-9A-Fa-f-]{36}|[a-z0-9][a-z0-9-]{0,61}[a-z0-9]|[a-z0-9]")


@FUZZ
@given(
    uid=text
    | st.text(max_size=300)
    | st.sampled_from(["../../../etc/cron.d/x", "a" * 63, "a" * 64, "abc\n", "..", "/", "a/b", "A-1"])
    | st.uuids().map(str)
)
def test_a_claim_uid_is_a_safe_file_name_or_refused(uid: str) -> None:
    try:
        accepted = validate_claim_uid(uid)
    except InvalidName as error:
        assert str(error)
        return
    # What is accepted is safe as a file name and a CDI device name, and is what was given.
    assert accepted == uid and SAFE_UID.fullmatch(uid)
    assert "/" not in uid and ".." not in uid and "\x00" not in uid and len(uid) <= 63
