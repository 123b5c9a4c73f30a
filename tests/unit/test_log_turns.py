"""The CLI's log handler writes the INFO lines of one event-loop turn in one write, in order, none lost."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner

from amqpjobs.runtime.logs import (
    ATOMIC_WRITE,
    MAX_LINE,
    JsonFormatter,
    TextFormatter,
    TurnHandler,
    configure_logging,
    cut,
)


class Writes:
    """A stream that records each write (what reaches the file descriptor: the stream is line-buffered)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def lines(self) -> list[str]:
        return [line.split(": ", 1)[1] for line in "".join(self.writes).splitlines()]


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, Writes]]:
    stream = Writes()
    handler = TurnHandler(stream)
    handler.setFormatter(TextFormatter())
    log = logging.getLogger("amqpjobs.test-turns")
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log, stream
    log.handlers.clear()


def test_the_lines_of_one_turn_go_out_in_one_write_after_it(logger: tuple[logging.Logger, Writes]) -> None:
    log, stream = logger

    async def main() -> list[int]:
        seen = []
        for turn in range(3):
            for i in range(4):
                log.info("turn=%d line=%d", turn, i)
            seen.append(len(stream.writes))  # nothing written during the turn
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        return seen

    assert asyncio.run(main()) == [0, 1, 2]
    assert len(stream.writes) == 3
    assert stream.lines() == [f"turn={t} line={i}" for t in range(3) for i in range(4)]


def test_a_warning_writes_the_waiting_lines_first_and_itself_at_once(logger: tuple[logging.Logger, Writes]) -> None:
    log, stream = logger

    async def main() -> int:
        log.info("one")
        log.debug("two")
        log.warning("three")
        written = len(stream.writes)
        log.info("four")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return written

    assert asyncio.run(main()) == 1  # "one", "two" and "three" at once, in one write
    assert stream.lines() == ["one", "two", "three", "four"]
    assert stream.writes[0].endswith("WARNING amqpjobs.test-turns: three\n")
    assert len(stream.writes) == 2


def test_a_line_from_another_thread_goes_out_at_once_after_the_waiting_ones(
    logger: tuple[logging.Logger, Writes],
) -> None:
    log, stream = logger

    async def main() -> None:
        log.info("on the loop")
        thread = threading.Thread(target=log.info, args=("from a thread",))
        thread.start()
        thread.join()
        assert stream.lines() == ["on the loop", "from a thread"]
        log.info("on the loop again")

    asyncio.run(main())
    flush_logs_of(log)
    assert stream.lines() == ["on the loop", "from a thread", "on the loop again"]


def stopped_after(call: Callable[..., object], *args: object) -> None:
    """Run ``call(*args)`` on a loop that stops and closes before its next turn (a turn-end callback never runs)."""
    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(call, *args)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()


def flush_logs_of(log: logging.Logger) -> None:
    for handler in log.handlers:
        handler.flush()


def test_lines_left_when_the_loop_ends_are_written_by_flush(logger: tuple[logging.Logger, Writes]) -> None:
    log, stream = logger

    stopped_after(log.info, "last words")
    assert stream.writes == []
    flush_logs_of(log)
    assert stream.lines() == ["last words"]

    async def again() -> None:  # a later loop's lines are kept for its turns as before
        log.info("next run")
        assert stream.lines() == ["last words"]
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(again())
    assert stream.lines() == ["last words", "next run"]


def test_writes_hold_whole_lines_and_stay_within_one_pipe_write(logger: tuple[logging.Logger, Writes]) -> None:
    log, stream = logger
    texts = [f"{i:03d} " + ("é" if i % 3 else "x") * (60 + i) for i in range(120)]

    async def main() -> None:
        for text in texts:
            log.info("%s", text)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(stream.writes) > 1
    for write in stream.writes:
        assert write.endswith("\n")
        assert len(write.encode()) <= ATOMIC_WRITE
    assert stream.lines() == texts
    # full writes: each would have gone over with the next line
    sizes = [len(w.encode()) for w in stream.writes]
    nexts = [len(w.split("\n", 1)[0].encode()) + 1 for w in stream.writes[1:]]
    assert all(size + n > ATOMIC_WRITE for size, n in zip(sizes, nexts, strict=False))


def test_a_stream_that_fails_at_the_turn_end_is_reported_not_raised_into_the_loop(
    logger: tuple[logging.Logger, Writes], capsys: pytest.CaptureFixture[str]
) -> None:
    log, _ = logger

    class Broken(Writes):
        def write(self, text: str) -> int:
            raise OSError(5, "Input/output error")

    handler = log.handlers[0]
    assert isinstance(handler, TurnHandler)
    handler.setStream(Broken())
    failures: list[object] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: failures.append(context))
        log.info("lost to the broken stream")
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert failures == []
    err = capsys.readouterr().err
    assert "--- Logging error ---" in err
    assert "Input/output error" in err
    assert "lost to the broken stream" in err


def test_a_cli_command_writes_its_last_lines_before_it_returns() -> None:
    import click

    from amqpjobs.cli._common import errors_to_exit_codes

    @click.command()
    @errors_to_exit_codes
    def command() -> None:
        configure_logging()
        stopped_after(logging.getLogger("amqpjobs.test-cli").info, "the last line")

    try:
        result = CliRunner().invoke(command, [])
    finally:
        logging.getLogger().handlers.clear()
    assert result.exit_code == 0, result.output
    assert result.stderr.endswith("INFO amqpjobs.test-cli: the last line\n")


def test_a_hostile_long_job_name_gives_a_line_of_at_most_1000_characters(logger: tuple[logging.Logger, Writes]) -> None:
    log, stream = logger
    name = "\x01" * 6000  # from an amqpjobs-job header: no length limit on the wire
    log.warning("job=%s id=%s outcome=quarantined", name, "m-1")
    (write,) = stream.writes
    line = write.rstrip("\n")
    assert "\n" not in line
    assert MAX_LINE - 30 <= len(line) <= MAX_LINE
    prefix = line[: line.index("job=")]
    full = prefix + "job=" + "\\x01" * 6000 + " id=m-1 outcome=quarantined"  # escaped: 4 characters each
    kept, marker = line.split("…")
    assert full.startswith(kept)
    assert not kept.endswith("\\")
    assert marker == f"[{len(full) - len(kept)} more characters]"
    assert len(write.encode()) <= ATOMIC_WRITE
    doc = json.loads(JsonFormatter().format(logging.makeLogRecord({"msg": "job=%s", "args": (name,)})))
    assert len(json.dumps(doc["message"], ensure_ascii=False)) <= MAX_LINE
    assert doc["message"].startswith("job=\x01\x01")
    assert doc["message"].endswith("more characters]")


def test_cut_keeps_what_fits_and_says_how_much_is_gone() -> None:
    assert cut("x" * MAX_LINE) == "x" * MAX_LINE
    long = cut("x" * 5000)
    kept = MAX_LINE - 30
    assert long == "x" * kept + f"…[{5000 - kept} more characters]"
    assert len(long) <= MAX_LINE
    assert cut("a" * (kept - 1) + "\\" + "b" * 100) == "a" * (kept - 1) + "…[101 more characters]"


def test_a_record_over_4096_bytes_is_split_between_writes_at_its_line_breaks(
    logger: tuple[logging.Logger, Writes],
) -> None:
    log, stream = logger
    try:
        raise ValueError("\n".join(f"detail line {i} " + "y" * 200 for i in range(60)))
    except ValueError:
        log.exception("the handler failed")
    assert len(stream.writes) > 1
    assert all(w.endswith("\n") and len(w.encode()) <= ATOMIC_WRITE for w in stream.writes)
    text = "".join(stream.writes)
    assert "ERROR amqpjobs.test-turns: the handler failed\n" in text
    assert all(f"detail line {i} " in text for i in range(60))


def test_chunks_are_measured_in_the_bytes_the_stream_writes(logger: tuple[logging.Logger, Writes]) -> None:
    log, _ = logger

    class Ascii(Writes):  # PYTHONIOENCODING=ascii: stderr writes 日 as \u65e5, 6 bytes
        encoding = "ascii"
        errors = "backslashreplace"

    stream = Ascii()
    handler = log.handlers[0]
    assert isinstance(handler, TurnHandler)
    handler.setStream(stream)

    async def main() -> None:
        for i in range(200):
            log.info("id=%s-%06d", "日" * 80, i)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(stream.writes) > 1
    for write in stream.writes:
        assert len(write.encode("ascii", "backslashreplace")) <= ATOMIC_WRITE
    assert stream.lines() == [f"id={'日' * 80}-{i:06d}" for i in range(200)]


def test_a_handlers_warning_is_a_line_of_ours_escaped_and_redacted() -> None:
    import warnings

    import click

    from amqpjobs.cli._common import errors_to_exit_codes

    @click.command()
    @errors_to_exit_codes
    def command() -> None:
        configure_logging()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("deprecated dsn postgres://app:s3cret@db/x\x1b[31m", UserWarning, stacklevel=1)

    try:
        result = CliRunner().invoke(command, [])
    finally:
        logging.getLogger().handlers.clear()
        logging.captureWarnings(False)
    assert result.exit_code == 0, result.output
    # helper-228: warnings.warn wrote straight to stderr, the password and the escape sequence as they were
    assert "WARNING py.warnings: " in result.stderr
    assert "UserWarning: deprecated dsn postgres://app:***@db/x\\x1b[31m" in result.stderr
    assert "s3cret" not in result.stderr
    assert "\x1b" not in result.stderr
