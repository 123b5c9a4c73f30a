"""A payload store in S3 or S3-compatible storage, through boto3: :class:`S3PayloadStore`.

Needs the ``s3`` extra (``pip install 'amqpjobs[s3]'``). The tests run it against moto's
S3 server, an emulator (README "Large payloads").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Unpack

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.payloads import PayloadStore, StoreOptions
from amqpjobs.runtime.refused_stores import refused_when_used
from amqpjobs.text import a_type


@refused_when_used  # another App's bad argument refuses no app named by --app
class S3PayloadStore(PayloadStore):
    """Payloads as objects ``<prefix>data/<key>`` of an S3 bucket; done marks as ``<prefix>done/<key>``.

    A done mark's body is the time of the success (seconds since the epoch, the worker's
    clock); a sweep lists ``<prefix>done/``, reads the marks whose ``LastModified`` is old
    enough, and deletes the payloads and marks past the grace. The bucket must exist. Calls
    run in threads (boto3 is blocking). See :mod:`amqpjobs.runtime.payloads` for the rules and
    the other arguments.

    Args:
        bucket: Bucket name.
        prefix: Key prefix of everything the store writes (default ``"amqpjobs-payloads/"``).
        client_options: Keyword arguments of ``boto3.client("s3", ...)`` (``endpoint_url``,
            ``region_name``, credentials; default: boto3's own configuration chain).

    Raises:
        ConfigurationError: ``bucket`` is empty, ``prefix`` is not a str or ``client_options``
            not a mapping of str keys (at once); boto3 is missing (at first use).

    """

    kind = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "amqpjobs-payloads/",
        client_options: Mapping[str, Any] | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        super().__init__(**options)
        if not isinstance(bucket, str) or not bucket.strip():
            raise ConfigurationError(
                f"S3PayloadStore(bucket=...) is empty or not a str (got {bucket!r}): give an existing bucket's "
                "name, e.g. S3PayloadStore('my-bucket', prefix='jobs/')"
            )
        if not isinstance(prefix, str):
            raise ConfigurationError(
                f"S3PayloadStore(prefix=...) must be a str (got {a_type(prefix)}: {prefix!r}): give the "
                "key prefix of everything the store writes, e.g. prefix='jobs/', or '' for none"
            )
        if client_options is not None and (
            not isinstance(client_options, Mapping) or not all(isinstance(k, str) for k in client_options)
        ):
            raise ConfigurationError(
                f"S3PayloadStore(client_options=...) must be a dict of boto3.client('s3', ...) keyword arguments "
                f"(got {a_type(client_options)}): e.g. client_options={{'region_name': 'eu-west-1', "
                "'endpoint_url': 'http://minio:9000'}}"
            )
        self.bucket = bucket
        self.prefix = prefix
        self._options = dict(client_options or {})
        self._client: Any = None

    def _fresh(self) -> None:
        """See :meth:`PayloadStore._fresh`."""
        self._client = None

    async def open(self) -> None:
        """Make the boto3 client (no request is sent)."""
        if self._client is not None:
            return
        try:
            import boto3
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError("S3PayloadStore needs boto3: pip install 'amqpjobs[s3]'") from exc
        self._client = boto3.client("s3", **self._options)

    async def _call(self, method: str, **kwargs: Any) -> Any:
        await self.open()
        return await asyncio.to_thread(getattr(self._client, method), Bucket=self.bucket, **kwargs)

    def _missing(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return str(code) in ("NoSuchKey", "404", "NotFound")

    async def write(self, key: str, data: bytes) -> None:
        """See :meth:`PayloadStore.write`."""
        await self._call("put_object", Key=f"{self.prefix}data/{key}", Body=data, ContentType="application/json")

    async def _get(self, name: str) -> bytes | None:
        """The body of object ``name``, or None when there is none."""
        try:
            answer = await self._call("get_object", Key=name)
        except Exception as exc:
            if self._missing(exc):
                return None
            raise
        body: bytes = await asyncio.to_thread(answer["Body"].read)
        return body

    async def read(self, key: str) -> bytes | None:
        """See :meth:`PayloadStore.read`."""
        return await self._get(f"{self.prefix}data/{key}")

    async def mark_done(self, key: str, at: float) -> bool:
        """See :meth:`PayloadStore.mark_done` (``at`` is the mark's body, as text; one HEAD of the payload first)."""
        try:
            await self._call("head_object", Key=f"{self.prefix}data/{key}")
        except Exception as exc:
            if self._missing(exc):
                return False
            raise
        await self._call("put_object", Key=f"{self.prefix}done/{key}", Body=repr(at).encode("ascii"))
        return True

    async def read_mark(self, key: str) -> float | None:
        """The time in ``key``'s done mark, or None (no mark; an unreadable one counts as ``0``: due)."""
        text = await self._get(f"{self.prefix}done/{key}")
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            return 0.0

    async def unmark(self, key: str) -> None:
        """See :meth:`PayloadStore.unmark`."""
        await self._call("delete_object", Key=f"{self.prefix}done/{key}")

    async def remove(self, key: str) -> None:
        """See :meth:`PayloadStore.remove`."""
        await self._call("delete_object", Key=f"{self.prefix}data/{key}")
        await self._call("delete_object", Key=f"{self.prefix}done/{key}")

    async def prune(self, older_than: float) -> int:
        """See :meth:`PayloadStore.prune`."""
        before = time.time() - older_than
        removed = 0
        token: str | None = None
        marks = f"{self.prefix}done/"
        while True:
            page = await self._call("list_objects_v2", Prefix=marks, **({"ContinuationToken": token} if token else {}))
            for item in page.get("Contents", []):
                # LastModified (whole seconds, the server's clock) is never after the time in the mark: a
                # mark modified at or after ``before`` is not due; the others are read for their exact time
                if item["LastModified"].timestamp() >= before:
                    continue
                key = item["Key"][len(marks) :]
                mark = await self.read_mark(key)
                if mark is not None and mark < before:
                    await self.remove(key)
                    removed += 1
            token = page.get("NextContinuationToken")
            if not token:
                return removed

    async def close(self) -> None:
        """Close the client's connections."""
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None
