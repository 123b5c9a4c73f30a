"""Second review of issue 25: payload stores and the sync publisher refuse bad use clearly."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, FilePayloadStore
from amqpjobs.errors import AmqpJobsError, ConfigurationError
from amqpjobs.runtime.payloads_s3 import S3PayloadStore
from amqpjobs.topology.models import Topology

pytestmark = pytest.mark.version_independent


def test_a_relative_file_root_is_resolved_once_at_construction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    store = FilePayloadStore("payloads")
    monkeypatch.chdir(tmp_path / "elsewhere")  # a worker that changes directory after building its app
    assert store.root == (tmp_path / "here" / "payloads").resolve()
    assert store.root.is_absolute()
    assert FilePayloadStore("~/p").root == Path(os.path.expanduser("~/p"))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"client_options": "us-east-1"}, "S3PayloadStore(client_options=...)"),
        ({"client_options": [("region_name", "x")]}, "S3PayloadStore(client_options=...)"),
        ({"prefix": 5}, "S3PayloadStore(prefix=...)"),
        ({"prefix": None}, "S3PayloadStore(prefix=...)"),
    ],
)
def test_s3_options_of_the_wrong_type_are_refused_naming_them(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        S3PayloadStore("bucket", **kwargs)
    assert str(caught.value).startswith(named), caught.value


def test_good_s3_options_are_taken() -> None:
    store = S3PayloadStore("bucket", prefix="", client_options={"region_name": "eu-west-1"})
    assert (store.prefix, store._options) == ("", {"region_name": "eu-west-1"})


def test_a_sync_publisher_used_after_its_with_block_says_so() -> None:
    app = App("closed-pub", topology=Topology(), url="amqp://guest:guest@127.0.0.1:1/")
    with app.sync_publisher() as publisher:
        pass
    with pytest.raises(AmqpJobsError) as caught:
        publisher.enqueue("any", {})
    assert not isinstance(caught.value, RuntimeError)
    assert "closed" in str(caught.value)
    assert "app.sync_publisher()" in str(caught.value)
    with pytest.raises(AmqpJobsError, match="closed"):
        publisher.job_status("some-id")


async def test_the_payload_missing_error_fits_the_workers_log_line(tmp_path: Path) -> None:
    """The worker logs ``error=<type>: <detail>`` cut at 300 characters: the fix must be inside them."""
    from amqpjobs.jobs.payload_refs import PayloadRef, PayloadRefError

    store = FilePayloadStore(tmp_path, name="payloads-eu-west-1")  # a longer name than the default 'file'
    with pytest.raises(PayloadRefError) as caught:
        await store.get(PayloadRef("payloads-eu-west-1", uuid.uuid4().hex), "billing-exports.quarantine")
    logged = f"PayloadRefError: {caught.value.detail}"[:300]  # as runtime/deliveries.py writes it
    assert "(amqpjobs quarantine purge billing-exports.quarantine --reason payload-missing)" in logged, logged
    assert "enqueue the job again with its payload" in logged
