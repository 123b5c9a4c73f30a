"""Which exchanges a confirm channel's publishes may go to without closing it (:mod:`amqpjobs.wire.publish`).

A publish to a missing exchange makes the broker close the channel (404, RabbitMQ "Channels"
-> "Channel-level exceptions"), and every publish in flight on it is cut off (not confirmed:
it may or may not be stored). So the first publish to each exchange is checked first, with a
passive declare on a throwaway channel of its own: that costs its own channel only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable

from aio_pika.abc import AbstractRobustConnection

from amqpjobs.errors import BrokerUnavailableError, UnroutableError
from amqpjobs.topology.versions import modulus_hash_refusal
from amqpjobs.wire.browse import exchange_exists
from amqpjobs.wire.connection import broker_info

#: A 404's reply text naming the missing exchange (RabbitMQ 3.x and 4.x ``rabbit_misc:not_found``).
_MISSING_EXCHANGE = re.compile(r"no exchange '(.*?)' in vhost")


class ExchangeChecks:
    """The exchanges seen to exist on ``connection``, and the checks under way.

    Args:
        connection: The publisher's connection (each check opens and closes a channel on it).
        is_modulus_exchange: Tells whether an exchange is a job queue's ``x-modulus-hash``
            exchange: a missing one before RabbitMQ 4.3 names the 4.3 requirement (see
            :class:`~amqpjobs.wire.publish.ConfirmedPublisher`). None: none is.
    """

    def __init__(
        self, connection: AbstractRobustConnection, is_modulus_exchange: Callable[[str], bool] | None = None
    ) -> None:
        self._connection = connection
        self._is_modulus_exchange = is_modulus_exchange
        self._known: set[str] = {""}  # the default exchange always exists
        self._checks: dict[str, asyncio.Future[bool]] = {}

    def seen(self, exchange: str) -> bool:
        """Whether ``exchange`` was seen to exist (and no 404 named it since)."""
        return exchange in self._known

    async def known(self, exchange: str) -> bool:
        """Whether ``exchange`` exists, checked now unless seen; False also if it could not be (raises nothing)."""
        if exchange not in self._known:
            with contextlib.suppress(UnroutableError):
                await self.check(exchange)
        return exchange in self._known

    async def check(self, exchange: str) -> None:
        """Check that ``exchange`` exists (concurrent callers wait for one check).

        Once per exchange seen to exist; at every call for one that is missing. One deleted
        after its check costs the shared channel once: the 404 is read by :meth:`forget_missing`,
        and each publish to it not yet queued is checked again.

        Raises:
            UnroutableError: it does not exist (nothing sent). A check that could not be made
                (not connected, a name the client refuses) raises nothing: the publish says why.
        """
        check = self._checks.get(exchange)
        if check is None:
            check = self._checks[exchange] = asyncio.ensure_future(exchange_exists(self._connection, exchange))
            check.add_done_callback(lambda _: self._checks.pop(exchange, None))
        try:
            exists = await asyncio.shield(check)  # a waiter's cancellation leaves the check to the others
        except Exception:  # not connected, or a name the client refuses: the publish itself says so
            return
        if not exists:
            raise UnroutableError(self.missing(exchange))
        self._known.add(exchange)

    def forget_missing(self, reason: BaseException | None) -> None:
        """A channel close (``reason``) naming a missing exchange (404): the next publish to it is checked again."""
        if reason is not None and (named := _MISSING_EXCHANGE.search(str(reason))) is not None:
            self._known.discard(named.group(1))

    def missing(self, exchange: str) -> str:
        """Why ``exchange`` is missing and the fix (:func:`missing_exchange`)."""
        version = None
        if self._is_modulus_exchange is not None and self._is_modulus_exchange(exchange):
            with contextlib.suppress(BrokerUnavailableError):
                version = broker_info(self._connection).version
        return missing_exchange(exchange, version, self._is_modulus_exchange)


def missing_exchange(
    exchange: str, version: tuple[int, ...] | None, is_modulus_exchange: Callable[[str], bool] | None
) -> str:
    """Why ``exchange`` is missing and the fix: before RabbitMQ 4.3 a modulus-hash exchange can't exist.

    Args:
        exchange: The exchange a 404 or a passive declare found missing.
        version: The broker's version (None: not known).
        is_modulus_exchange: Tells whether an exchange is a job queue's ``x-modulus-hash`` exchange.
    """
    text = f"exchange {exchange!r} does not exist"
    if version is not None and is_modulus_exchange is not None and is_modulus_exchange(exchange):
        refusal = modulus_hash_refusal(version)
        if refusal is not None:  # topology apply refuses modulus-hash here: "apply" would be a dead end
            return f"{text}: {refusal[0]}; {refusal[1]}"
    return f"{text}: apply the topology (amqpjobs topology apply)"
