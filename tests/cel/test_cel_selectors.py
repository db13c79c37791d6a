"""Selectors as users write them in DeviceClasses and ResourceClaims, against realistic devices."""

from __future__ import annotations

import pytest

from tangram.cel import DeviceActivation, compile_selector
from tangram.dra.model import Device
from tests.cel.devices import h100

GPU_DOMAIN = 'device.attributes["gpu.tangram.dev"]'
CAPACITY = 'device.capacity["gpu.tangram.dev"]'


@pytest.mark.parametrize(
    ("expression", "on_gpu", "on_mig"),
    [
        # string attributes
        (f'{GPU_DOMAIN}.type == "gpu"', True, False),
        (f'{GPU_DOMAIN}.type == "mig"', False, True),
        (f'{GPU_DOMAIN}["type"] != "mig"', True, False),
        (f'{GPU_DOMAIN}.productName == "NVIDIA H100 80GB HBM3"', True, True),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:40"', True, True),
        # int and bool attributes
        (f"has({GPU_DOMAIN}.index) && {GPU_DOMAIN}.index == 3", True, False),
        (f"has({GPU_DOMAIN}.index) && {GPU_DOMAIN}.index < 4", True, False),
        (f"{GPU_DOMAIN}.type == 'gpu' && {GPU_DOMAIN}.index == 3.0", True, False),
        (f"has({GPU_DOMAIN}.migCapable) && {GPU_DOMAIN}.migCapable", True, False),
        (f"has({GPU_DOMAIN}.migCapable) && !{GPU_DOMAIN}.migCapable", False, False),
        # version attributes compared as versions
        (f'{GPU_DOMAIN}.driverVersion == semver("580.95.5")', True, True),
        (f'{GPU_DOMAIN}.driverVersion.isGreaterThan(semver("550.54.15"))', True, True),
        (f'{GPU_DOMAIN}.driverVersion.isLessThan(semver("580.100.0"))', True, True),
        (f'{GPU_DOMAIN}.driverVersion.compareTo(semver("580.95.5")) == 0', True, True),
        (f"{GPU_DOMAIN}.driverVersion.major() >= 575", True, True),
        (f"{GPU_DOMAIN}.driverVersion.minor() == 95 && {GPU_DOMAIN}.driverVersion.patch() == 5", True, True),
        (
            f"has({GPU_DOMAIN}.cudaComputeCapability) && "
            f'{GPU_DOMAIN}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
            True,
            False,
        ),
        # capacity quantities
        (f'{CAPACITY}.memory.compareTo(quantity("40Gi")) >= 0', True, False),
        (f'{CAPACITY}.memory.compareTo(quantity("39Gi")) >= 0', True, True),
        (f'{CAPACITY}.memory == quantity("80Gi")', True, False),
        (f'{CAPACITY}.memory == quantity("85899345920")', True, False),
        (f'{CAPACITY}.memory.isGreaterThan(quantity("80G"))', True, False),
        (f'{CAPACITY}.memory == quantity("40448Mi")', False, True),
        (f'{CAPACITY}.memory.isLessThan(quantity("40Gi"))', False, True),
        (f"{CAPACITY}.multiprocessors.asInteger() > 100", True, False),
        (f'{CAPACITY}.memory.sub(quantity("40Gi")).sign() == 1', True, False),
        # the device itself
        ('device.driver == "gpu.tangram.dev"', True, True),
        ("!device.allowMultipleAllocations", True, True),
        ('"gpu.tangram.dev" in device.attributes', True, True),
        ('"example.com" in device.attributes', False, False),
        # a domain the device does not have reads as an empty map, as in Kubernetes
        ('has(device.attributes["example.com"].model)', False, False),
        ('!has(device.capacity["example.com"].memory)', True, True),
        # strings
        (f'{GPU_DOMAIN}.productName.startsWith("NVIDIA H100")', True, True),
        (f'{GPU_DOMAIN}.productName.lowerAscii().contains("h100")', True, True),
        (f'{GPU_DOMAIN}.productName.matches("H(100|200)")', True, True),
        (f'has({GPU_DOMAIN}.profile) && {GPU_DOMAIN}.profile.split(".")[0] == "3g"', False, True),
        (f'{GPU_DOMAIN}.productName.split(" ").size() == 4', True, True),
        # lists and macros
        (f'{GPU_DOMAIN}.type in ["gpu", "vgpu"]', True, False),
        (f'["gpu", "mig"].exists(t, t == {GPU_DOMAIN}.type)', True, True),
        (f'{GPU_DOMAIN}.exists(name, name == "profile")', False, True),
        (f"{GPU_DOMAIN}.all(name, name.size() < 64)", True, True),
        (f'{GPU_DOMAIN}.filter(name, name.startsWith("p")).size() == 1', True, False),
        (f'{GPU_DOMAIN}.exists_one(name, name == "productName")', True, True),
        (f"{GPU_DOMAIN}.map(name, name.size()).max() == 21", True, False),
        # error absorption: false && error is false, as in Kubernetes
        (f'{GPU_DOMAIN}.type == "mig" && {GPU_DOMAIN}.profile == "3g.40gb"', False, True),
        (f'{GPU_DOMAIN}.type == "gpu" || {GPU_DOMAIN}.profile == "3g.40gb"', True, True),
    ],
)
def test_selector_matrix(expression: str, on_gpu: bool, on_mig: bool, gpu: Device, mig: Device) -> None:
    selector = compile_selector(expression)
    assert selector.matches(gpu) is on_gpu
    assert selector.matches(mig) is on_mig


def test_driver_is_passed_separately(gpu: Device) -> None:
    selector = compile_selector('device.driver == "other.example.com"')
    assert selector.matches(gpu) is False
    assert selector.matches(gpu, driver="other.example.com") is True


def test_unqualified_names_belong_to_the_driver_domain() -> None:
    device = h100(model="A")
    selector = compile_selector('has(device.attributes["gpu.tangram.dev"].model)')
    assert selector.matches(device) is True
    assert selector.matches(device, driver="other.example.com") is False


def test_activation_is_reusable_across_selectors(gpu: Device, mig: Device) -> None:
    activations = [DeviceActivation(gpu), DeviceActivation(mig)]
    is_mig = compile_selector(f'{GPU_DOMAIN}.type == "mig"')
    big = compile_selector(f'{CAPACITY}.memory.compareTo(quantity("64Gi")) > 0')
    assert is_mig.matches_many(activations) == [False, True]
    assert big.matches_many(activations) == [True, False]
    assert big.matches_many([gpu, mig]) == [True, False]


def test_compile_cache_returns_the_same_selector() -> None:
    expression = 'device.attributes["gpu.tangram.dev"].type == "gpu" && true'
    first = compile_selector(expression)
    assert compile_selector(expression) is first
    assert first.expression == expression
    assert compile_selector(expression + " ") is not first
