"""lab --link-rate: the value is checked before anything changes, and tc gets a token bucket
per node link end."""

import pytest

from nodeprep.errors import InputError
from nodeprep.lab.config import tc_lines, validate_link_rate


@pytest.mark.parametrize(
    "given,want",
    [
        ("200mbit", "200mbit"),
        ("200MBIT", "200mbit"),
        (" 1gbit ", "1gbit"),
        ("100gbit", "100gbit"),
        (None, ""),
        ("none", ""),
        ("", ""),
    ],
)
def test_rates_accepted(given, want):
    assert validate_link_rate(given) == want


@pytest.mark.parametrize(
    "bad",
    [
        "200",
        "0mbit",
        "200mb",
        "-1mbit",
        "1.5gbit",
        "101gbit",
        "200mbit; rm -rf /",
        "2\n00mbit",
        "x" * 100,
    ],
)
def test_rates_refused_in_one_line(bad):
    with pytest.raises(InputError) as e:
        validate_link_rate(bad)
    assert "\n" not in str(e.value) and "--link-rate" in str(e.value)


def test_tc_lines():
    assert tc_lines("eth0", "200mbit") == [
        "qdisc replace dev eth0 root tbf rate 200mbit burst 250000 latency 50ms"
    ]
    assert tc_lines("eth0", "1mbit")[0].split()[9] == str(32 * 1024)  # the floor
    assert tc_lines("np-fan-1", "") == ["qdisc del dev np-fan-1 root"]


def test_link_rates_kept_by_later_ups_and_none_on_a_new_veth():
    from nodeprep.lab.config import link_rates

    assert link_rates({"link_rate": "200mbit"}, True, None) == ("200mbit", "200mbit")
    assert link_rates({"link_rate": "200mbit"}, False, None) == ("", "200mbit")  # after down
    assert link_rates({"link_rate": "200mbit"}, True, "none") == ("200mbit", "")
    assert link_rates(None, False, "1gbit") == ("", "1gbit")
    with pytest.raises(InputError):
        link_rates(None, False, "fast")
