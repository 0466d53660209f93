from pathlib import Path

import pytest

from air_hpc.errors import InputError
from air_hpc.health.ibstat import parse_ibstat, select_ports

DATA = Path(__file__).parent.parent / "data" / "ibstat"


def test_single_active_port() -> None:
    (port,) = parse_ibstat((DATA / "single_active_hdr200.txt").read_text())
    assert (port.name, port.state, port.physical_state, port.rate_gbps, port.link_layer) == (
        "mlx5_0:1",
        "Active",
        "LinkUp",
        200.0,
        "InfiniBand",
    )
    assert port.up


def test_mixed_states_on_a_dgx() -> None:
    ports = {p.ca: p for p in parse_ibstat((DATA / "dgx_h100_mixed.txt").read_text())}
    assert list(ports) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"]
    assert [p.up for p in ports.values()] == [True, False, True, False, False]
    assert (ports["mlx5_1"].state, ports["mlx5_1"].physical_state) == ("Down", "Polling")
    # Physically up but no subnet manager configured it: not usable.
    assert (ports["mlx5_3"].state, ports["mlx5_3"].physical_state) == ("Initializing", "LinkUp")
    assert (ports["mlx5_4"].physical_state, ports["mlx5_4"].rate_gbps) == ("Disabled", 40.0)
    assert ports["mlx5_2"].rate_gbps == 200.0


def test_two_ports_and_a_roce_adapter() -> None:
    ports = parse_ibstat((DATA / "dual_port_with_roce.txt").read_text())
    assert [(p.name, p.up, p.link_layer) for p in ports] == [
        ("mlx5_0:1", True, "InfiniBand"),
        ("mlx5_0:2", False, "InfiniBand"),
        ("mlx5_bond_0:1", True, "Ethernet"),
    ]
    assert [p.name for p in select_ports(ports, ("mlx5_0:1",))] == ["mlx5_0:1"]
    assert [p.name for p in select_ports(ports, ("mlx5_0",))] == ["mlx5_0:1", "mlx5_0:2"]
    assert select_ports(ports, ("mlx5_9",)) == ()


def test_empty_output_has_no_ports() -> None:
    assert parse_ibstat("") == ()


def test_port_without_state_names_the_line() -> None:
    text = "CA 'mlx5_0'\n\tPort 1:\n\t\tRate: 100\n"
    with pytest.raises(InputError, match=r"ibstat:2: port mlx5_0:1 has no State, Physical state"):
        parse_ibstat(text)


def test_port_before_any_adapter_is_an_error() -> None:
    with pytest.raises(InputError, match="ibstat:1: 'Port' before any 'CA'"):
        parse_ibstat("Port 1:\n\t\tState: Active\n")


def test_rate_that_is_not_a_number() -> None:
    text = "CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: fast\n"
    with pytest.raises(InputError, match="rate 'fast' is not a number"):
        parse_ibstat(text, "node7.txt")
