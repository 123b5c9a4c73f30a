"""The App name's rule: ``App()`` refuses a name its connection names or the broker's log can't take.

Before, ``App("a\\nb")`` was taken as it was: the worker's connection name ``a\\nb-worker`` split
a line of the broker's log in two, and a 300-character name made connection names of 300+
bytes (helper-226); only ``schedule run`` refused it (its queue names).
"""

from __future__ import annotations

import pytest

from amqpjobs import App
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.app_name import CONNECTION_NAME_MAX_BYTES, LONGEST_CONNECTION_ROLE


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("a\nb", r"App name 'a\nb' has a control or invisible character (\n at index 1)"),
        ("shop\x1b[31m", r"has a control or invisible character (\x1b at index 4)"),
        ("shop\u202e", r"has a control or invisible character (\u202e at index 4)"),
        ("", "App name must not be empty or blank"),
        ("   ", "App name must not be empty or blank"),
        ("\ud800", "is not valid Unicode text (a lone surrogate)"),
        ("x" * 234, "App name is 234 UTF-8 bytes, over 233: its connection names (<app>-sync-publisher-thread)"),
        ("é" * 117, "App name is 234 UTF-8 bytes, over 233"),
        (3, "App name must be a string, got int"),
        # helper-227: format characters that show nothing, and blanks at the ends, made look-alike names
        ("sh\u200bop", r"has a control or invisible character (\u200b at index 2)"),
        ("a\u2060b", r"(\u2060 at index 1)"),
        ("a\u00adb", r"(\xad at index 1)"),
        ("a\u061cb", r"(\u061c at index 1)"),
        ("a\U000e0041", r"(\U000e0041 at index 1)"),
        (" shop", "App name ' shop' begins or ends with a blank"),
        ("shop ", "begins or ends with a blank"),
    ],
)
def test_a_name_no_connection_name_can_carry_is_refused_when_the_app_is_made(name: object, said: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        App(name)  # type: ignore[arg-type]
    assert said in str(err.value)
    assert "\n" not in str(err.value)  # the error itself is one printable line
    assert "\x1b" not in str(err.value)


@pytest.mark.parametrize(
    "name", ["shop", "é/#", "x" * 233, "é" * 116 + "x", "Billing Service (EU)", "caf\u00e9", "😀x"]
)
def test_names_that_fit_are_taken(name: str) -> None:
    assert App(name).name == name


def test_the_bound_leaves_room_for_the_longest_connection_name() -> None:
    longest = "x" * 233 + LONGEST_CONNECTION_ROLE
    assert len(longest.encode()) == CONNECTION_NAME_MAX_BYTES == 255
    assert LONGEST_CONNECTION_ROLE == "-sync-publisher-thread"  # the sync publisher thread's (runtime/app.py _role)
