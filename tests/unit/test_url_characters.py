"""A URL holding a blank, a control character or an invisible format character is refused at every URL door.

The doors: ``--url`` / ``AMQPJOBS_URL`` (one node or a cluster's comma-separated list),
``--management-url`` / ``AMQPJOBS_MANAGEMENT_URL``, and the PostgreSQL DSNs of the ledger,
results and payload stores. Blanks around a URL (and around each item of a list) are left
out as before; one inside is refused, as RFC 3986 has no blank nor control character in a URL.
The error names the option and the character, and never shows the password.

Before, each of these was taken: ``--management-url 'http://localhost:15672/ x'`` (every call
went to a path with a blank in it), ``'http://localhost:15672/\\x01'``, a password with a raw
``\\x01`` or NUL in the AMQP URL (Python's URL parser drops tabs and line feeds silently), a
zero-width space in a user name, and ``postgresql://u:pw@db/ap p``.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from amqpjobs.cli import main
from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.pg_connection import dsn_problem
from amqpjobs.text import url_text_problem
from amqpjobs.wire.settings import broker_settings

AMQP = "amqp://guest:s3cret@localhost:5672/"
#: (what is in it, where in the URL) -> a bad character's place.
BAD = {
    "a blank": ("http://localhost:15672/ x", "amqp://guest:s3c ret@localhost:5672/", "a blank (U+0020)"),
    "a tab": ("http://localhost:15672/\tx", "amqp://guest:s3c\tret@localhost:5672/", "a blank (U+0009)"),
    "a line feed": ("http://local\nhost:15672", "amqp://guest:s3cret@localhost:5672/\nx", "a blank (U+000A)"),
    "a no-break space": ("http://localhost:15672/\u00a0x", "amqp://guest:s3c\u00a0ret@localhost:5672/",
                         "a blank (U+00A0)"),
    "a control character": ("http://localhost:15672/\x01", "amqp://guest:s3c\x01ret@localhost:5672/",
                            "a control character (U+0001)"),
    "DEL": ("http://localhost:15672/a\x7fb", "amqp://guest:s3cret@localhost:5672/#x\x7f",
            "a control character (U+007F)"),
    "NUL": ("http://localhost:15672/?x=\x00", "amqp://guest:s3c\x00ret@localhost:5672/",
            "a control character (U+0000)"),
    "a zero-width space": ("http://localhost:15672/\u200b", "amqp://gu\u200best:s3cret@localhost:5672/",
                           "an invisible format character (U+200B)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_the_rule_names_the_character(case: str) -> None:
    management, amqp, words = BAD[case]
    assert url_text_problem(management) == f"it holds {words}: a URL has none (%-encode it)"
    assert url_text_problem(amqp) == f"it holds {words}: a URL has none (%-encode it)"


@pytest.mark.parametrize("case", list(BAD))
def test_a_management_url_with_it_is_refused_naming_the_option(case: str) -> None:
    management, _, words = BAD[case]
    with pytest.raises(ConfigurationError) as caught:
        broker_settings(AMQP, management)
    text = str(caught.value)
    assert words in text
    assert "--management-url or AMQPJOBS_MANAGEMENT_URL" in text
    assert "s3cret" not in text


def test_a_management_url_password_is_never_shown() -> None:
    with pytest.raises(ConfigurationError) as caught:
        broker_settings(AMQP, "http://admin:top se cret@localhost:15672/")
    assert "se cret" not in str(caught.value)
    assert "top" not in str(caught.value)


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("alone", [True, False], ids=["one node", "node 2 of 2"])
def test_an_amqp_url_with_it_is_refused_never_showing_the_password(case: str, alone: bool) -> None:
    _, amqp, words = BAD[case]
    url = amqp if alone else f"amqp://guest:s3cret@localhost:5672/,{amqp.replace('5672', '5673')}"
    with pytest.raises(ConfigurationError) as caught:
        broker_settings(url, "http://localhost:15672")
    text = str(caught.value)
    assert (words if "blank" not in words else "it holds a blank") in text, text  # blanks: "as URLs run together"
    assert ("broker URL" if alone else "broker URL 2 of 2") in text
    assert "s3c" not in text


def test_blanks_around_urls_are_left_out_as_before() -> None:
    s = broker_settings(f"  {AMQP} , {AMQP.replace('5672', '5673')} ", " http://localhost:15672 ")
    assert s.management_url == "http://localhost:15672"


@pytest.mark.parametrize(
    "dsn",
    ["postgresql://u:pw@db/ap p", "postgresql://u:p\x01w@db/app", "host=db dbname=app\x01", "host=db password=\u200bx"],
)
def test_a_dsn_with_it_is_refused(dsn: str) -> None:
    problem = dsn_problem(dsn)
    assert problem is not None
    assert problem.startswith("holds "), problem
    assert "pw" not in problem


def test_a_dsn_of_keyword_pairs_keeps_its_blanks() -> None:
    assert dsn_problem("host=db dbname=app user=u password='a b'") is None


def test_the_cli_refuses_a_management_url_with_a_blank_exit_2() -> None:
    result = CliRunner().invoke(
        main, ["status", "--queues", "work", "--url", AMQP, "--management-url", "http://localhost:15672/ x"]
    )
    assert result.exit_code == 2, result.output
    assert "a blank (U+0020)" in result.output
    assert "--management-url" in result.output
