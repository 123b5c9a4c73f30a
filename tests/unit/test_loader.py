from __future__ import annotations

import os
from pathlib import Path

import pytest

from amqpjobs.errors import TopologyValidationError
from amqpjobs.topology.loader import load_topology
from tests.invalid_topologies import HEADER, INVALID, job

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_topology_names_file_and_key_path(tmp_path: Path, case: str) -> None:
    text, key_path, word = INVALID[case]
    path = write(tmp_path, text)
    with pytest.raises(TopologyValidationError) as info:
        load_topology(path)
    problems = info.value.problems
    assert problems, "at least one problem"
    matching = [p for p in problems if p.key_path == key_path]
    assert matching, f"no problem at {key_path}: {[str(p) for p in problems]}"
    assert all(p.file == str(path) for p in problems)
    assert any(word.lower() in f"{p.message} {p.fix}".lower() for p in matching), [str(p) for p in matching]
    assert all(p.fix for p in problems)


def test_unknown_key_lists_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, HEADER + job('retry_tier = ["5s"]')))
    (problem,) = info.value.problems
    assert "retry_tiers" in problem.fix


def test_quorum_priority_fix_depends_on_broker_version(tmp_path: Path) -> None:
    path = write(tmp_path, HEADER + job('type = "quorum"\nmax_priority = 5'))
    with pytest.raises(TopologyValidationError) as v3:
        load_topology(path, broker_version=(3, 10, 8))
    with pytest.raises(TopologyValidationError) as v4:
        load_topology(path, broker_version=(4, 0, 5))
    assert v3.value.problems[0].message == "quorum-queue priorities 0-31 need RabbitMQ 4.3+ (connected: 3.10.8)"
    assert v3.value.problems[0].fix.startswith("upgrade the broker to RabbitMQ 4.3+")
    assert "two levels, 0-4 normal and 5-255 high" in v4.value.problems[0].fix
    assert load_topology(path, broker_version=(4, 3, 6)).warnings == ()  # strict priorities 0-31
    (note,) = load_topology(path).warnings  # no broker: accepted, with a note
    assert "quorum-queue priorities need RabbitMQ 4.3+" in note


def test_priority_above_ten_warns(tmp_path: Path) -> None:
    loaded = load_topology(write(tmp_path, HEADER + job("max_priority = 20")))
    assert len(loaded.warnings) == 1
    assert "job_queue[0].max_priority" in loaded.warnings[0]


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = HEADER + job('max_priority = 0\nretry_tiers = ["x"]\ncolour = "red"')
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, text))
    paths = sorted(p.key_path for p in info.value.problems)
    assert paths == ["job_queue[0].colour", "job_queue[0].max_priority", "job_queue[0].retry_tiers[0]"]


def test_folder_merges_files_and_checks_across_them(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(HEADER)
    (tmp_path / "b.toml").write_text(job())
    loaded = load_topology(tmp_path)
    assert [q.name for q in loaded.topology.job_queues] == ["work"]
    (tmp_path / "c.toml").write_text(job())
    with pytest.raises(TopologyValidationError) as info:
        load_topology(tmp_path)
    assert info.value.problems[0].file.endswith("c.toml")


def test_missing_path_is_a_validation_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyValidationError, match="no such file") as info:
        load_topology(tmp_path / "nope.toml")
    # a whole-file problem has no key path: none is printed (it was "nope.toml: -: no such ...")
    assert [str(p) for p in info.value.problems] == [
        f"{tmp_path / 'nope.toml'}: no such file or folder (fix: give a topology file or folder)"
    ]
    (tmp_path / "bad.toml").write_text("[[job_queue]]\nname = 'x'\nretry_tiers = 3\n")
    with pytest.raises(TopologyValidationError) as keyed:
        load_topology(tmp_path / "bad.toml")
    assert str(keyed.value.problems[0]).startswith(f"{tmp_path / 'bad.toml'}: job_queue[0].")


def test_shipped_example_topology_is_valid() -> None:
    loaded = load_topology(ROOT / "topology")
    assert [q.name for q in loaded.topology.job_queues] == ["urgent", "batch", "billing"]
    assert loaded.warnings == ()


def test_max_age_on_a_quorum_job_queue_is_refused_naming_the_queue_and_the_fix(tmp_path: Path) -> None:
    """Quorum queues report no head_message_timestamp (3.10 and 4.3.6 alike): max_age would never be checked."""
    path = write(tmp_path, HEADER + job('type = "quorum"\nmax_age = "5m"', name="emails"))
    with pytest.raises(TopologyValidationError) as info:
        load_topology(path)
    (problem,) = info.value.problems
    assert problem.key_path == "job_queue[0].max_age"
    assert problem.message.startswith("max_age can't be checked on quorum job queue 'emails'")
    assert problem.fix == 'use type = "classic" for max_age, or bound the queue with max_depth instead'
    ok = write(tmp_path, HEADER + job('type = "quorum"\nmax_depth = 100', name="emails"))
    assert load_topology(ok).topology.layout("emails").bounds.max_depth == 100


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, text))
    return [f"{p.key_path}: {p.message} (fix: {p.fix})" for p in info.value.problems]


def test_integer_beyond_what_amqp_carries_is_one_rule_with_the_bound(tmp_path: Path) -> None:
    # review M1: plan said "0 conflict(s)", apply declared 4 queues then died in pamqp
    assert problems_of(tmp_path, HEADER + job('type = "quorum"\ndelivery_limit = 9223372036854775808')) == [
        "job_queue[0].delivery_limit: Input should be less than or equal to 9223372036854775807 "
        "(the largest integer an AMQP argument carries) (got 9223372036854775808) "
        "(fix: lower the value to the maximum shown)"
    ]
    loaded = load_topology(write(tmp_path, HEADER + job('max_length = 9223372036854775807\noverflow = "drop-head"')))
    assert loaded.topology.job_queues[0].max_length == 2**63 - 1


def test_a_whole_number_error_names_the_toml_value_and_its_fix(tmp_path: Path) -> None:
    # review L6: max_priority = true read "(got 'True') (fix: give a whole number, without quotes)"
    assert problems_of(tmp_path, HEADER + job("max_priority = true")) == [
        "job_queue[0].max_priority: Input should be a valid integer (got true) (fix: give a whole number such as 5, "
        "not true or false)"
    ]
    assert problems_of(tmp_path, HEADER + job('max_priority = "5"')) == [
        'job_queue[0].max_priority: Input should be a valid integer (got "5") (fix: give a whole number, without '
        "quotes)"
    ]


def test_a_type_error_does_not_hide_the_other_problems_of_its_job_queue(tmp_path: Path) -> None:
    # review L6: max_priority = 5.0 with delivery_limit = 3 on a classic queue reported 1 of 2 problems
    assert problems_of(tmp_path, HEADER + job("max_priority = 5.0\ndelivery_limit = 3")) == [
        "job_queue[0].max_priority: Input should be a valid integer (got 5.0) (fix: give a whole number, without "
        "a decimal point)",
        "job_queue[0].delivery_limit: delivery_limit applies to quorum queues only (fix: remove it, or use type = "
        '"quorum")',
    ]


def test_sub_millisecond_tiers_are_refused_once_without_a_spurious_duplicate(tmp_path: Path) -> None:
    # review L6: tiers [0.0001, 0.0004] also gave "duplicate queue ... 'q.retry.0d'"
    assert problems_of(tmp_path, HEADER + job("retry_tiers = [0.0001, 0.0004]")) == [
        f"job_queue[0].retry_tiers[{i}]: {t}: sub-millisecond tiers are refused (x-message-ttl counts whole "
        "milliseconds, 1 ms to ~49 days) (fix: use a delay between 1ms and 49d)"
        for i, t in enumerate(("0.1ms", "0.4ms"))
    ]


def test_a_tier_between_two_milliseconds_is_refused_not_rounded(tmp_path: Path) -> None:
    # an outsider's "1.5ms" became queue q.retry.2ms silently
    assert problems_of(tmp_path, HEADER + job('retry_tiers = ["1.5ms", "2.0004s", "5s"]')) == [
        "job_queue[0].retry_tiers[0]: 1.5ms: x-message-ttl counts whole milliseconds (fix: write 1ms or 2ms)",
        "job_queue[0].retry_tiers[1]: 2000.4ms: x-message-ttl counts whole milliseconds (fix: write 2000ms or 2001ms)",
    ]


def problems_in(folder: Path) -> list[str]:
    with pytest.raises(TopologyValidationError) as info:
        load_topology(folder)
    return [f"{Path(p.file).name}: {p.key_path}: {p.message} (fix: {p.fix})" for p in info.value.problems]


def test_a_type_error_in_an_exchange_or_binding_does_not_hide_the_cross_file_checks(tmp_path: Path) -> None:
    # fresh-user review: `durable = "yes"` and `routing_key = 5` stopped the load, hiding the bindings
    # to a queue and an exchange declared nowhere (the [[job_queue]] section's errors were already gathered)
    (tmp_path / "a.toml").write_text('[[exchange]]\nname = "jobs"\ndurable = "yes"\n\n' + job())
    (tmp_path / "b.toml").write_text(
        '[[binding]]\nsource = "jobs"\ndestination = "nowhere"\nrouting_key = 5\n\n'
        '[[binding]]\nsource = "jobs"\ndestination = "work"\nrouting_key = "extra"\n\n'
        '[[binding]]\nsource = "elsewhere"\ndestination = "work"\n'
    )
    assert problems_in(tmp_path) == [
        "a.toml: exchange[0].durable: unknown key 'durable' (fix: remove it or correct its spelling; allowed keys "
        "here: name, type)",
        "b.toml: binding[0].routing_key: Input should be a valid string (got 5) (fix: give a string)",
        "b.toml: binding[0].destination: queue 'nowhere' is not declared (fix: declare the queue or correct the name)",
        "b.toml: binding[2].source: exchange 'elsewhere' is not declared (fix: declare it in an [[exchange]] entry "
        "or correct the name)",
    ]


def test_an_entry_with_a_type_error_still_counts_as_declared_and_its_other_keys_are_checked(tmp_path: Path) -> None:
    # the job queue's exchange is the broken [[exchange]] entry: declared, so no "not declared" for it;
    # the broken binding's own other key (a quarantine exchange bound back to work) is still checked
    (tmp_path / "a.toml").write_text('[[exchange]]\nname = "jobs"\ntype = "topik"\n')
    (tmp_path / "b.toml").write_text(
        job()
        + '[[binding]]\nsource = "work.quarantine"\ndestination = "work"\nrouting_key = ["a"]\n\n'
        + '[[exchange]]\nname = "amq.mine"\nauto_delete = 1\n'
    )
    assert problems_in(tmp_path) == [
        "a.toml: exchange[0].type: Input should be 'direct', 'topic', 'fanout', 'headers' or 'x-consistent-hash' "
        '(got "topik") (fix: use one of the values listed)',
        "b.toml: exchange[0].auto_delete: unknown key 'auto_delete' (fix: remove it or correct its spelling; "
        "allowed keys here: name, type)",
        "b.toml: binding[0].routing_key: Input should be a valid string (got ['a']) (fix: give a string)",
        "b.toml: exchange[0].name: 'amq.mine': names starting 'amq.' are reserved by RabbitMQ (fix: choose another "
        "name)",
        "b.toml: binding[0].destination: binding quarantine exchange 'work.quarantine' to 'work' sends failed jobs "
        "straight back to work: a loop (fix: remove the binding; use `amqpjobs replay` instead)",
    ]


def test_checks_that_rest_on_a_refused_key_are_not_guessed(tmp_path: Path) -> None:
    # shards = true is refused: whether 'a.shard-2' exists rests on it (no "not declared" guessed);
    # the next job queue keeps its own index, and the checks that don't rest on the refused key still run
    (tmp_path / "t.toml").write_text(
        HEADER + job("shards = true", name="a") + job('type = "quorom"\ndelivery_limit = 3', name="b")
        + job(name="c").replace('"jobs"', '"nope"')
        + '[[binding]]\nsource = "jobs"\ndestination = "a.shard-2"\nrouting_key = "k"\n\n'
        + '[[binding]]\nsource = "jobs"\ndestination = "zzz"\n'
    )  # fmt: skip
    assert problems_in(tmp_path) == [
        "t.toml: job_queue[0].shards: Input should be a valid integer (got true) (fix: give a whole number such as "
        "5, not true or false)",
        "t.toml: job_queue[1].type: Input should be 'classic' or 'quorum' (got \"quorom\") (fix: use one of the "
        "values listed)",
        "t.toml: job_queue[2].exchange: exchange 'nope' is not declared (fix: declare it in an [[exchange]] entry "
        "or correct the name)",
        "t.toml: binding[1].destination: queue 'zzz' is not declared (fix: declare the queue or correct the name)",
    ]


def test_entries_after_one_left_out_keep_their_place_in_the_file(tmp_path: Path) -> None:
    # exchange[0] has no name (left out): the duplicate's "also from" names exchange[1], not exchange[0];
    # max_priority = "300" reads as 300, still refused: the job queue is declared without it (no guessed
    # "queue 'work' is not declared" for the binding into it)
    (tmp_path / "t.toml").write_text(
        '[[exchange]]\ntype = "topic"\n\n' + HEADER + HEADER + job('max_priority = "300"')
        + '[[binding]]\nsource = "jobs"\ndestination = "work"\nrouting_key = "more"\n'
    )  # fmt: skip
    assert [p.split(" (fix:")[0] for p in problems_in(tmp_path)] == [
        "t.toml: exchange[0].name: Field required",
        't.toml: job_queue[0].max_priority: Input should be a valid integer (got "300")',
        f"t.toml: exchange[2].name: duplicate exchange name 'jobs' (also from {tmp_path / 't.toml'}: exchange[1].name)",
    ]


def test_a_path_that_is_neither_file_nor_folder_is_named_so(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.toml"  # helper-227: given directly, a loop of links was "no such file or folder"
    loop.symlink_to(loop)
    for path, what in ((fifo, "a FIFO (named pipe)"), (Path("/dev/null"), "a device"),
                       (loop, "a link to nothing (or a loop of links)")):  # fmt: skip
        with pytest.raises(TopologyValidationError) as info:
            load_topology(path)  # must not hang on the FIFO either
        assert [str(p) for p in info.value.problems] == [
            f"{path}: not a regular file or folder: {what} (fix: give a topology file or folder)"
        ]


def test_a_folder_entry_that_is_no_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "good.toml").write_text("[[exchange]]\nname = 'jobs'\n")
    (tmp_path / "sub.toml").mkdir()
    (tmp_path / "gone.toml").symlink_to(tmp_path / "nowhere.toml")
    os.mkfifo(tmp_path / "pipe.toml")  # helper-226: a FIFO, /dev/zero and a loop were each called "a folder, or ..."
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    (tmp_path / "loop.toml").symlink_to(tmp_path / "loop.toml")
    with pytest.raises(TopologyValidationError) as info:
        load_topology(tmp_path)
    fix = "(fix: remove it from the folder, or make it a topology file)"
    assert [str(p) for p in info.value.problems] == [
        f"{tmp_path / 'gone.toml'}: not a regular file: a link to nothing (or a loop of links) {fix}",
        f"{tmp_path / 'loop.toml'}: not a regular file: a link to nothing (or a loop of links) {fix}",
        f"{tmp_path / 'pipe.toml'}: not a regular file: a FIFO (named pipe) {fix}",
        f"{tmp_path / 'sub.toml'}: not a regular file: a folder {fix}",
        f"{tmp_path / 'zero.toml'}: not a regular file: a device {fix}",
    ]


def test_file_names_and_key_paths_are_escaped_in_problems(tmp_path: Path) -> None:
    forged = tmp_path / "x\n  - forged.toml: ok\ny.toml"
    with pytest.raises(TopologyValidationError) as info:
        load_topology(forged)
    assert "\n" not in str(info.value.problems[0])
    assert "\\n  - forged.toml: ok\\ny.toml: no such file or folder" in str(info.value.problems[0])
    (tmp_path / "keys.toml").write_text('"evil\\u001b[31m\\nforged" = 1\n')
    with pytest.raises(TopologyValidationError) as keyed:
        load_topology(tmp_path / "keys.toml")
    text = str(keyed.value.problems[0])
    assert "\n" not in text
    assert "\x1b" not in text


def test_a_job_queue_name_too_long_for_its_derived_names_lists_each_and_the_limit(tmp_path: Path) -> None:
    """Its ``<name>.quarantine`` exchange must fit pamqp's 127 characters, so a job queue's name at most 116."""
    assert load_topology(write(tmp_path, HEADER + job("", name="a" * 116))).topology.layout("a" * 116)
    (problem,) = problems_of(tmp_path, HEADER + job("", name="a" * 244))
    assert problem == (
        f"job_queue[0].name: job queue name {'a' * 40!r}... is 244 characters, too long for the names derived from "
        f"it: exchange {'a' * 40!r}... is 255 characters (the AMQP client takes at most 127); routing key "
        f"{'amqpjobs.pause.' + 'a' * 25!r}... is 259 bytes (RabbitMQ allows 255) (fix: use at most 116 characters "
        "(tiers, quarantine and pause add to the name))"
    )
    (problem,) = problems_of(tmp_path, HEADER + job("", name="a" * 117))
    assert f"exchange {'a' * 40!r}... is 128 characters (the AMQP client takes at most 127)" in problem


def test_a_job_queue_name_the_client_cant_send_gets_the_job_queue_limit_in_its_fix(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path, HEADER + job("", name="wé"))
    assert problem.startswith("job_queue[0].name: queue name 'wé' has characters the AMQP client refuses")
    assert problem.endswith(", at most 116 characters)")


@pytest.mark.parametrize(
    ("tiers", "expected"),
    [
        ('["1.5ms", "2ms"]', ["job_queue[0].retry_tiers[0]: 1.5ms: x-message-ttl counts whole milliseconds (fix: "
                              "write 1ms or 2ms)"]),
        ('["1s", "1s"]', ["job_queue[0].retry_tiers[1]: retry tiers must strictly increase (1s then 1s) (fix: list "
                          "tiers from shortest to longest, each once)"]),
        ('["1h", "3600s"]', ["job_queue[0].retry_tiers[1]: retry tiers must strictly increase (1h then 1h) (fix: "
                             "list tiers from shortest to longest, each once)"]),
        ('["50d"]', ["job_queue[0].retry_tiers[0]: 50d: longer than x-message-ttl takes (x-message-ttl counts "
                     "whole milliseconds, 1 ms to ~49 days) (fix: use a delay between 1ms and 49d)"]),
    ],
)  # fmt: skip
def test_each_bad_tier_is_one_true_problem(tmp_path: Path, tiers: str, expected: list[str]) -> None:
    # a retest: "1.5ms" then "2ms" was also "must strictly increase (0.0015s then 0.002s)"; equal tiers were also
    # a duplicate queue "give each ... job queue a unique name"; 50d read "4.32e+06s"
    assert problems_of(tmp_path, HEADER + job(f"retry_tiers = {tiers}")) == expected


def test_a_file_that_is_no_utf8_or_starts_with_a_bom_says_so_with_the_line_and_the_fix(tmp_path: Path) -> None:
    """Was: 'Invalid statement (at line 1, column 1)' for a BOM, and "'utf-8' codec can't decode byte 0xff in
    position 20: invalid start byte (fix: fix the file's syntax)" for Latin-1 bytes (helper-177)."""
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + job().encode())
    with pytest.raises(TopologyValidationError) as info:
        load_topology(bom)
    assert [(p.message, p.fix) for p in info.value.problems] == [
        ("the file starts with a UTF-8 byte order mark (BOM), which TOML does not allow",
         "save it as UTF-8 without a BOM"),
    ]  # fmt: skip
    latin = tmp_path / "latin.toml"
    latin.write_bytes(HEADER.encode() + b'[[job_queue]]\nname = "caf\xe9"\nexchange = "jobs"\n')
    with pytest.raises(TopologyValidationError) as info:
        load_topology(latin)
    assert [(p.message, p.fix) for p in info.value.problems] == [
        ("not UTF-8: byte 0xe9 at line 5, column 12 can't be decoded", "save the file as UTF-8"),
    ]


def test_a_topology_name_takes_no_whitespace_and_no_message_says_it_may(tmp_path: Path) -> None:
    """Was: "String should match pattern '^[^\\s]+$'" for a blank, and for an escape character the fix
    'rename it within letters a-z A-Z, digits, space and ...': a space, then refused (helper-177)."""
    assert problems_of(tmp_path, '[[exchange]]\nname = "a b"\n') == [
        'exchange[0].name: a name can\'t hold whitespace (a space, tab or line break) (got "a b") '
        "(fix: take letters a-z A-Z, digits and - _ . : @ # , / + only)"
    ]
    assert problems_of(tmp_path, '[[exchange]]\nname = "a\\u001bb"\n') == [
        "exchange[0].name: exchange name 'a\\x1bb' has characters the AMQP client refuses "
        "(fix: rename it within letters a-z A-Z, digits and - _ . : @ # , / +, at most 127 characters)"
    ]


def test_a_job_queue_declared_twice_is_one_problem_naming_it(tmp_path: Path) -> None:
    """Was 6 problems, one per derived name ('duplicate queue (expanded from job queue 'work') name
    'work.quarantine'', '... 'work.parked'', ... 'pause flag ...', 'exchange ...') (helper-177)."""
    assert problems_of(tmp_path, HEADER + job('retry_tiers = ["1s"]') + job()) == [
        f"job_queue[1].name: duplicate job queue name 'work' (also from {tmp_path / 't.toml'}: job_queue[0].name) "
        "(fix: give each exchange / job queue a unique name)"
    ]


@pytest.mark.parametrize("depth", [100, 100_000])
def test_values_nested_past_reading_are_one_problem_not_a_traceback(tmp_path: Path, depth: int) -> None:
    """Was (100,000): RecursionError out of tomllib, a traceback and exit 1; ~900 in retry_tiers too (helper-177)."""
    text = HEADER + job("retry_tiers = " + "[" * depth + "]" * depth)
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, text))
    assert [(p.key_path, p.message, p.fix) for p in info.value.problems] == [
        ("-", "its arrays or inline tables nest deeper than 32 levels",
         "a topology file nests a few levels at most: remove the extra [ ] or { }"),
    ]  # fmt: skip


def test_an_exchange_type_the_broker_does_not_offer_is_refused_naming_its_plugin(tmp_path: Path) -> None:
    """Was: plan '17 to create, 0 conflict(s)'; apply declared the other exchanges, then the broker closed the
    connection, COMMAND_INVALID - invalid exchange type 'x-consistent-hash', exit 3 (helper-177: seen with the
    plugin's type unregistered on a 3.10 node)."""
    path = write(tmp_path, HEADER + '[[exchange]]\nname = "hash"\ntype = "x-consistent-hash"\n' + job())
    amqp_own = frozenset({"direct", "fanout", "headers", "topic"})
    with pytest.raises(TopologyValidationError) as info:
        load_topology(path, exchange_types=amqp_own)
    assert [(p.key_path, p.message, p.fix) for p in info.value.problems] == [
        ("exchange[1].type", "the broker offers no exchange type 'x-consistent-hash' (it offers direct, fanout, "
         "headers, topic)", "enable its plugin (rabbitmq-plugins enable rabbitmq_consistent_hash_exchange), or "
         "another type"),
    ]  # fmt: skip
    assert load_topology(path, exchange_types=amqp_own | {"x-consistent-hash"}).topology.exchanges[1].type == (
        "x-consistent-hash"
    )


@pytest.mark.parametrize("extra", ['retry_tiers = ["5s", "1m"]', 'retry_tiers = ["5s"]\nshards = 3', ""])
def test_a_job_queue_name_over_255_characters_is_told_the_length_its_derived_names_allow(
    tmp_path: Path, extra: str
) -> None:
    """Before: "at most 255 characters" (fix: use at most 255), and a 255-character name then failed at 116."""
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, HEADER + job(extra, name="a" * 300)))
    (problem,) = [p for p in info.value.problems if p.key_path == "job_queue[0].name"]
    limit = int(problem.fix.removeprefix("use at most ").split()[0])
    assert 0 < limit < 255, problem.fix
    load_topology(write(tmp_path, HEADER + job(extra, name="a" * limit)))
    with pytest.raises(TopologyValidationError) as again:
        load_topology(write(tmp_path, HEADER + job(extra, name="a" * (limit + 1))))
    (shorter,) = [p for p in again.value.problems if p.key_path == "job_queue[0].name"]
    assert shorter.fix.startswith(f"use at most {limit} characters"), shorter.fix
