"""@app.cron's arguments of the wrong type or a zone that is not a fixed IANA name: a ConfigurationError (no broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError, CronRule

pytestmark = pytest.mark.version_independent

ZONE = "time zone must be a str, an IANA name such as 'Europe/Paris'"
TOPOLOGY = Path(__file__).resolve().parents[2] / "topology"


def _schedule(**kwargs: Any) -> App:
    app = App("cronargs", topology=TOPOLOGY)

    @app.cron(**kwargs)
    @app.job("reports.build", queue="batch")
    async def build(payload: dict[str, Any], ctx: object) -> None: ...

    return app


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"expression": 123}, "cron expression must be a str such as '0 8 * * *' (got int 123)"),
        ({"expression": None}, "cron expression must be a str such as '0 8 * * *' (got NoneType None)"),
        ({"expression": b"* * * * *"}, "cron expression must be a str such as '0 8 * * *' (got bytes b'* * * * *')"),
        ({"expression": "* * * * *", "tz": None}, f"{ZONE} (got NoneType None)"),
        ({"expression": "* * * * *", "tz": 1}, f"{ZONE} (got int 1)"),
        ({"expression": "* * * * *", "name": 7}, "schedule name must be a str (got int 7)"),
    ],
)
def test_an_argument_of_the_wrong_type_is_a_configuration_error_naming_it(kwargs: dict[str, Any], said: str) -> None:
    # Before: AttributeError: 'int' object has no attribute 'strip' (expression), TypeError: expected str,
    # bytes or os.PathLike object, not NoneType (tz), TypeError: expected string or bytes-like object (name).
    with pytest.raises(ConfigurationError) as caught:
        _schedule(**kwargs)
    assert said in str(caught.value)


@pytest.mark.parametrize(
    "tz", ["localtime", "posixrules", "Factory", "right/UTC", "posix/Europe/Paris", "right/Europe/Paris"]
)
def test_a_zone_that_is_no_fixed_iana_name_is_refused(tz: str) -> None:
    # Before: accepted. 'localtime' is the host's /etc/localtime, so two replicas on hosts set to other
    # zones fire one daily schedule at two instants (two tick ids: the job runs twice); 'posixrules' is
    # US Eastern on Debian; 'right/' zones count leap seconds.
    with pytest.raises(ConfigurationError) as caught:
        _schedule(expression="0 8 * * *", tz=tz)
    message = str(caught.value)
    assert f"time zone {tz!r} is not a fixed IANA zone name" in message
    assert "give an IANA name such as 'UTC' or 'Europe/Paris'" in message
    with pytest.raises(ConfigurationError):
        CronRule("0 8 * * *", tz)


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris", "America/New_York", "Etc/GMT+2", "Australia/Lord_Howe"])
def test_iana_zones_are_still_taken(tz: str) -> None:
    app = _schedule(expression="0 8 * * *", tz=tz)
    assert [s.rule.tz for s in app.schedules()] == [tz]
