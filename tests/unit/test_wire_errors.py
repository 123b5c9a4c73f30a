"""The one error map (amqpjobs.wire.errors): every client-library exception comes out as ours."""

from __future__ import annotations

import aio_pika.exceptions
import aiormq.exceptions
import pamqp.exceptions
import pytest
from aiormq.abc import DeliveredMessage
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from amqpjobs import errors
from amqpjobs.wire.abc import Acknowledgeable, Browser, Publisher
from amqpjobs.wire.browse import QueueBrowser
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.errors import ERROR_MAP, LIBRARY_ERRORS, broker_errors, connection_lost, error_kind, translate
from amqpjobs.wire.publish import ConfirmedPublisher


def _returned() -> aiormq.exceptions.PublishError:
    """What aiormq raises for a ``basic.return`` (built without a channel)."""
    returned = Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="work")
    message = DeliveredMessage(delivery=returned, header=ContentHeader(), body=b"", channel=None)  # type: ignore[arg-type]
    return aiormq.exceptions.PublishError(message, returned)


#: One raised exception per row of the map (a subclass where the row's class is abstract-ish), and ours.
CASES: list[tuple[BaseException, type[errors.AmqpJobsError]]] = [
    (_returned(), errors.UnroutableError),
    (aiormq.exceptions.DeliveryError(None, Basic.Nack(delivery_tag=1)), errors.PublishNackedError),
    (aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no queue 'q'"), errors.NotFoundError),
    (pamqp.exceptions.AMQPNotFound("no queue"), errors.NotFoundError),
    (aiormq.exceptions.ChannelLockedResource("RESOURCE_LOCKED"), errors.ResourceLockedError),
    (pamqp.exceptions.AMQPResourceLocked("locked"), errors.ResourceLockedError),
    (aiormq.exceptions.ChannelPreconditionFailed("PRECONDITION_FAILED"), errors.PreconditionFailedError),
    (pamqp.exceptions.AMQPPreconditionFailed("inequivalent arg"), errors.PreconditionFailedError),
    (aiormq.exceptions.ChannelInvalidStateError("writer is None"), errors.ChannelClosedError),
    (aiormq.exceptions.ChannelClosed("closed"), errors.ChannelClosedError),
    (aiormq.exceptions.ChannelAccessRefused("ACCESS_REFUSED"), errors.ChannelClosedError),
    (aiormq.exceptions.AMQPConnectionError("refused"), errors.BrokerUnavailableError),
    (aiormq.exceptions.ProbableAuthenticationError("auth"), errors.BrokerUnavailableError),
    (aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED"), errors.BrokerUnavailableError),
    (aio_pika.exceptions.MessageProcessError("processed", None), errors.BrokerError),
    (aiormq.exceptions.AMQPError("other"), errors.BrokerError),
    (aiormq.exceptions.MethodNotImplemented("no"), errors.BrokerError),
    (pamqp.exceptions.PAMQPException("pamqp"), errors.BrokerError),
    (pamqp.exceptions.AMQPInternalError("internal"), errors.BrokerError),
    (ConnectionResetError("reset by peer"), errors.BrokerUnavailableError),
]


@pytest.mark.parametrize(("raised", "ours"), CASES, ids=[type(r).__name__ for r, _ in CASES])
def test_each_mapping(raised: BaseException, ours: type[errors.AmqpJobsError]) -> None:
    assert error_kind(raised) is ours
    mapped = translate(raised)
    assert type(mapped) is ours
    assert mapped.__cause__ is raised
    with pytest.raises(ours) as caught, broker_errors():
        raise raised
    assert type(caught.value) is ours
    assert caught.value.__cause__ is raised


def test_every_row_is_exercised() -> None:
    rows = {library for library, _ in ERROR_MAP}
    hit = {next(library for library, _ in ERROR_MAP if isinstance(r, library)) for r, _ in CASES}
    assert rows == hit


def test_every_row_maps_into_our_tree() -> None:
    for _, ours in ERROR_MAP:
        assert issubclass(ours, errors.AmqpJobsError)
    assert set(LIBRARY_ERRORS) == {library for library, _ in ERROR_MAP}


@pytest.mark.parametrize(
    "passing",
    [errors.BusyError("busy", "r", None), TimeoutError(), ValueError("ours to raise"), KeyError("k")],
)
def test_anything_else_passes_through(passing: BaseException) -> None:
    assert translate(passing) is None
    with pytest.raises(type(passing)) as caught, broker_errors():
        raise passing
    assert caught.value is passing


def test_no_error_no_effect() -> None:
    with broker_errors():
        pass


def test_the_wire_implements_the_interface() -> None:
    """Structural checks mypy makes on this module; at run time, the methods exist."""

    def _delivery(d: Delivery) -> Acknowledgeable:
        return d

    def _browser(b: QueueBrowser) -> Browser:
        return b

    def _publisher(p: ConfirmedPublisher) -> Publisher:
        return p

    for cls, proto in ((Delivery, Acknowledgeable), (QueueBrowser, Browser), (ConfirmedPublisher, Publisher)):
        for name in vars(proto):
            if not name.startswith("_"):
                assert callable(getattr(cls, name)), (cls, name)


@pytest.mark.parametrize("name", ["café.quarantine", "jobs(1)", "<x>", "a" * 257])
def test_pamqps_refusal_of_a_name_becomes_ours_naming_the_queue(name: str):
    from pamqp.commands import Queue

    with pytest.raises(errors.UnaddressableNameError) as caught, broker_errors(name):
        Queue.Declare(queue=name, passive=True)  # pamqp validates in the constructor
    assert f"queue {name!r} can't be addressed by the AMQP client" in str(caught.value)
    assert "rename it" in str(caught.value)
    assert caught.value.name == name
    assert isinstance(caught.value.__cause__, ValueError)


def test_an_unrelated_value_error_is_not_taken_for_a_name_refusal():
    with pytest.raises(ValueError, match="Invalid value for queue-ish"), broker_errors("q"):
        raise ValueError("Invalid value for queue-ish")
    with pytest.raises(ValueError, match="ticket must be 0"), broker_errors("q"):
        raise ValueError("ticket must be 0")


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure"), True),
        (aiormq.exceptions.ConnectionClosed(0, "normal closed"), True),
        (aiormq.exceptions.ConnectionInternalError(541, "INTERNAL_ERROR"), True),  # the worker's rescue mends it
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (aiormq.exceptions.AMQPConnectionError("cut"), True),
        (aiormq.exceptions.ChannelInvalidStateError("<Connection> closed"), True),
        (aiormq.exceptions.ConnectionNotAllowed(530, "NOT_ALLOWED - number of channels opened (3) has reached"), False),
        (aiormq.exceptions.ConnectionChannelError(504, "CHANNEL_ERROR - second 'channel.open' seen"), False),
        (aiormq.exceptions.ConnectionFrameError(501, "FRAME_ERROR"), False),
        (aiormq.exceptions.ChannelNotFoundEntity(404, "NOT_FOUND"), False),
        (RuntimeError("Connection was not opened"), False),
        (ValueError("x"), False),
    ],
)
def test_a_connection_going_away_is_told_from_a_refusal_the_reconnect_would_meet_again(
    exc: BaseException, lost: bool
) -> None:
    assert connection_lost(exc) is lost
