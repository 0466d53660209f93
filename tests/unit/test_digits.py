"""One parser of decimal numbers: ASCII digits only, whatever ``str.isdigit`` or ``int`` would accept."""

import re

import pytest

from air_hpc.digits import DIGITS, ascii_int


@pytest.mark.parametrize(("text", "expected"), [("12", 12), (" 007 ", 7), ("0", 0), ("65535\n", 65535)])
def test_ascii_numbers(text: str, expected: int) -> None:
    assert ascii_int(text) == expected


@pytest.mark.parametrize("text", ["", " ", "-1", "+1", "1.5", "1e3", "1_000", "²", "١٢", "１２", "12a", "1 2"])
def test_anything_else_is_not_a_number(text: str) -> None:
    assert ascii_int(text) is None


def test_the_pattern_matches_ascii_digits_only() -> None:
    assert re.fullmatch(DIGITS, "0123456789")
    assert not re.fullmatch(DIGITS, "١٢")  # r"\d" matches these, and int() reads them as 12
