import pytest

from tangram.hardware.catalogue import PRODUCTS, product, product_by_nvml_name, product_by_pci_device_id


def test_h200_facts_written_out() -> None:
    h200 = product("H200-141GB")
    assert h200.nvml_name == "NVIDIA H200"
    assert h200.pci_device_id == 0x233510DE
    assert h200.memory_mib == 143771
    assert h200.multiprocessors == 132
    assert h200.architecture == "hopper"
    assert h200.cuda_compute_capability == (9, 0)
    assert h200.nvlink is not None and h200.nvlink.links == 18 and h200.nvlink.total_gbps == 900.0
    assert not h200.mig_toggle_needs_reset
    table = [
        (p.name, p.profile_id, p.profile_index, p.starts, p.memory_slices, p.compute_slices)
        for p in h200.mig_profiles
    ]
    assert table == [
        ("1g.18gb", 19, 0, (0, 1, 2, 3, 4, 5, 6), 1, 1),
        ("1g.18gb+me", 20, 7, (0, 1, 2, 3, 4, 5, 6), 1, 1),
        ("1g.35gb", 15, 9, (0, 2, 4, 6), 2, 1),
        ("2g.35gb", 14, 1, (0, 2, 4), 2, 2),
        ("3g.71gb", 9, 2, (0, 4), 4, 3),
        ("4g.71gb", 5, 3, (0,), 4, 4),
        ("7g.141gb", 0, 4, (0,), 8, 7),
    ]
    assert h200.profile_by_name("3g.71gb").memory_mib == 71168  # type: ignore[union-attr]


def test_h100_sxm_profile_memory_and_sms() -> None:
    h100 = product("H100-SXM5-80GB")
    assert [(p.name, p.memory_mib, p.multiprocessors, p.instance_count) for p in h100.mig_profiles] == [
        ("1g.10gb", 9984, 16, 7),
        ("1g.10gb+me", 9984, 16, 1),
        ("1g.20gb", 20096, 26, 4),
        ("2g.20gb", 20096, 32, 3),
        ("3g.40gb", 40448, 60, 2),
        ("4g.40gb", 40448, 64, 1),
        ("7g.80gb", 81152, 132, 1),
    ]


def test_a30_has_its_own_ids_and_four_slices() -> None:
    a30 = product("A30")
    assert (a30.memory_slices, a30.compute_slices, a30.mig_toggle_needs_reset) == (4, 4, True)
    assert [(p.name, p.profile_id, p.starts, p.memory_slices) for p in a30.mig_profiles] == [
        ("1g.6gb", 14, (0, 1, 2, 3), 1),
        ("1g.6gb+me", 21, (0, 1, 2, 3), 1),
        ("2g.12gb", 5, (0, 2), 2),
        ("2g.12gb+me", 6, (0, 2), 2),
        ("4g.24gb", 0, (0,), 4),
    ]


def test_ampere_needs_reset_and_ada_has_no_mig_or_nvlink() -> None:
    assert product("A100-SXM4-80GB").mig_toggle_needs_reset
    assert product("A100-PCIE-80GB").profile_by_id(0).name == "7g.80gb"  # type: ignore[union-attr]
    l40s = product("L40S")
    assert (l40s.mig_capable, l40s.nvlink, l40s.memory_mib, l40s.multiprocessors) == (False, None, 46068, 142)
    assert product("B200").nvlink.total_gbps == 1800.0  # type: ignore[union-attr]


def test_lookups_by_name_and_pci_id() -> None:
    assert product_by_nvml_name("NVIDIA H100 80GB HBM3").key == "H100-SXM5-80GB"  # type: ignore[union-attr]
    assert product_by_nvml_name("A100-SXM4-40GB").key == "A100-SXM4-40GB"  # type: ignore[union-attr]
    assert product_by_pci_device_id(0x27B810DE).key == "L4"  # type: ignore[union-attr]
    assert product_by_nvml_name("Tesla T4") is None


def test_unknown_product_error_names_it() -> None:
    with pytest.raises(KeyError, match="unknown GPU product 'H300'"):
        product("H300")


def test_every_mig_table_is_consistent() -> None:
    for p in PRODUCTS.values():
        for prof in p.mig_profiles:
            assert all(s + prof.memory_slices <= p.memory_slices for s in prof.starts), (p.key, prof.name)
            assert prof.compute_slices <= p.compute_slices
        assert len({pr.profile_index for pr in p.mig_profiles}) == len(p.mig_profiles)
