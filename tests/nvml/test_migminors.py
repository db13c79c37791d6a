from pathlib import Path

import pytest

from tangram.nvml import mig_capability_minors, parse_mig_minors
from tangram.nvml.migminors import MigMinorsError
from tangram.nvml.sim import SimNvml

REAL_EXCERPT = """config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi1/ci1/access 14
gpu1/gi0/access 138
"""


def test_parse_real_format() -> None:
    minors = parse_mig_minors(REAL_EXCERPT)
    assert minors["config"] == 1 and minors["monitor"] == 2
    assert minors["gpu0/gi1/access"] == 12 and minors["gpu0/gi1/ci1/access"] == 14


def test_simulated_file_has_nvidia_numbering(tmp_path: Path) -> None:
    path = tmp_path / "mig-minors"
    path.write_text(SimNvml.from_machine("a30-4").sim_mig_minors())
    assert mig_capability_minors(0, 1, 0, minors_file=path) == (12, 13)
    assert mig_capability_minors(0, 0, 0, minors_file=path) == (3, 4)
    assert mig_capability_minors(1, 0, 0, minors_file=path) == (138, 139)
    assert mig_capability_minors(0, 13, 0, minors_file=path) == (120, 121)


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(MigMinorsError, match="line 2: cannot parse 'gpu0/gi/access x'"):
        parse_mig_minors("config 1\ngpu0/gi/access x\n")
    path = tmp_path / "m"
    path.write_text(REAL_EXCERPT)
    with pytest.raises(MigMinorsError, match="no entry gpu3/gi1/access"):
        mig_capability_minors(3, 1, 0, minors_file=path)
    with pytest.raises(MigMinorsError, match="cannot read"):
        mig_capability_minors(0, 1, 0, minors_file=tmp_path / "missing")
