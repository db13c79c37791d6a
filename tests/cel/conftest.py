from __future__ import annotations

import pytest

from tangram.dra.model import Device
from tests.cel.devices import h100, mig_3g


@pytest.fixture
def gpu() -> Device:
    return h100()


@pytest.fixture
def mig() -> Device:
    return mig_3g()
