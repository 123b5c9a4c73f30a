from __future__ import annotations

import pytest

import amqpjobs
from amqpjobs import errors


def test_all_is_sorted_and_complete() -> None:
    assert amqpjobs.__all__ == sorted(amqpjobs.__all__)
    for name in amqpjobs.__all__:
        assert hasattr(amqpjobs, name), name
    public = {n for n in vars(amqpjobs) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(amqpjobs.__all__)


def test_every_error_is_exported_and_under_one_root() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    for cls in classes:
        assert issubclass(cls, errors.AmqpJobsError), cls
        assert cls.__name__ in amqpjobs.__all__, cls
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} missing from the tree in errors.py"


def test_default_url_is_a_deprecated_alias_of_set_default_url() -> None:
    import pytest

    from amqpjobs.topology.models import Topology

    app = amqpjobs.App("alias", topology=Topology())
    with pytest.warns(DeprecationWarning, match=r"use App\.set_default_url\(\)"):
        app.default_url("amqp://guest:guest@127.0.0.1:5999/")
    assert app.settings().url == "amqp://guest:guest@127.0.0.1:5999/"
    given = amqpjobs.App("given", topology=Topology(), url="amqp://guest:guest@127.0.0.1:5998/")
    given.set_default_url("amqp://guest:guest@127.0.0.1:5999/")  # a URL of its own wins
    assert given.settings().url == "amqp://guest:guest@127.0.0.1:5998/"


def test_each_name_is_its_home_modules_object_loaded_when_first_used() -> None:
    import importlib

    homes = amqpjobs._HOMES
    assert set(amqpjobs.__all__) == {*homes, "__version__"}
    for name, home in homes.items():
        assert getattr(amqpjobs, name) is getattr(importlib.import_module(home), name), name
    assert set(amqpjobs.__all__) <= set(dir(amqpjobs))
    with pytest.raises(AttributeError, match="module 'amqpjobs' has no attribute 'Nope'"):
        amqpjobs.Nope  # type: ignore[attr-defined]  # noqa: B018
