"""`python -m tangram.cdi.simroot`: a simulated machine's driver install, as a container lays it out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.cdi.driver import discover_driver
from tangram.cdi.simroot import main


def test_lays_out_the_driver_the_machine_reports_and_the_cdi_driver_lookup_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "root"), "--machine", "hgx-h200"]) == 0
    # the HGX H200 machine file's driver, written out rather than read from the code under test
    driver = discover_driver(tmp_path / "root", expected_version="580.95.05")
    assert driver.version == "580.95.05"
    assert (tmp_path / "root/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05").is_file()
    assert "580.95.05" in capsys.readouterr().out


def test_an_unknown_machine_is_refused_with_the_names_shipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "root"), "--machine", "hgx-h900"]) == 1
    err = capsys.readouterr().err
    assert "no machine named 'hgx-h900'" in err and "hgx-h200" in err
    assert not (tmp_path / "root").exists()
