"""Invalid topology files, each with the key path its error must name."""

from __future__ import annotations

HEADER = '[[exchange]]\nname = "jobs"\n\n'


def job(extra: str = "", name: str = "work") -> str:
    return f'[[job_queue]]\nname = "{name}"\nexchange = "jobs"\n{extra}\n'


INVALID: dict[str, tuple[str, str, str]] = {
    # id: (file text, key path the error names, a word the message contains)
    "unknown-key": (HEADER + job('retry_tier = ["5s"]'), "job_queue[0].retry_tier", "unknown key"),
    "unknown-top-level-key": (HEADER + job() + '[[queue]]\nname = "x"\n', "queue", "unknown key"),
    "bad-duration": (HEADER + job('retry_tiers = ["5 seconds"]'), "job_queue[0].retry_tiers[0]", "duration"),
    "negative-duration": (HEADER + job("retry_tiers = [-5]"), "job_queue[0].retry_tiers[0]", "positive"),
    "priority-zero": (HEADER + job("max_priority = 0"), "job_queue[0].max_priority", "greater than or equal"),
    "priority-256": (HEADER + job("max_priority = 256"), "job_queue[0].max_priority", "less than or equal"),
    "quorum-priority": (
        HEADER + job('type = "quorum"\nmax_priority = 32'),
        "job_queue[0].max_priority",
        "quorum queues have priorities 0-31",
    ),
    "quorum-drop-head": (
        HEADER + job('type = "quorum"\nmax_length = 10\noverflow = "drop-head"'),
        "job_queue[0].overflow",
        "reject-publish",
    ),
    "classic-full-queue-drops-retries": (
        HEADER + job('max_length = 10\nretry_tiers = ["5s"]'),
        "job_queue[0].max_length",
        "dropped",
    ),
    "quorum-max-age": (
        HEADER + job('type = "quorum"\nmax_age = "5m"'),
        "job_queue[0].max_age",
        "no head message timestamp",
    ),
    "classic-delivery-limit": (HEADER + job("delivery_limit = 3"), "job_queue[0].delivery_limit", "quorum"),
    "duplicate-job-queue": (HEADER + job() + job(), "job_queue[1].name", "duplicate"),
    # names RabbitMQ takes but pamqp (the AMQP client) refuses to put in a frame: refused before any declare
    "job-queue-name-the-client-refuses": (
        HEADER + job(name='odd<b>&\\"é%2F..x'),
        "job_queue[0].name",
        "- _ . : @ # , / +",
    ),
    "exchange-name-the-client-refuses": (
        '[[exchange]]\nname = "jobs!"\n' + job().replace('"jobs"', '"jobs!"'),
        "exchange[0].name",
        "rename",
    ),
    "quarantine-exchange-too-long-for-the-client": (HEADER + job(name="w" * 120), "job_queue[0].name", "127"),
    "duplicate-exchange": (HEADER + HEADER + job(), "exchange[1].name", "duplicate"),
    "expanded-name-collision": (
        HEADER + job('retry_tiers = ["5s"]') + job(name="work.retry.5s"),
        "job_queue[1].name",
        "duplicate",
    ),
    "dangling-exchange": (
        HEADER + '[[job_queue]]\nname = "w"\nexchange = "nope"\n',
        "job_queue[0].exchange",
        "not declared",
    ),
    "dangling-binding": (
        HEADER + job() + '[[binding]]\nsource = "jobs"\ndestination = "ghost"\n',
        "binding[0].destination",
        "not declared",
    ),
    "tiers-not-increasing": (
        HEADER + job('retry_tiers = ["1m", "30s"]'),
        "job_queue[0].retry_tiers[1]",
        "increase",
    ),
    "tiers-repeated": (
        HEADER + job('retry_tiers = ["60s", "1m"]'),
        "job_queue[0].retry_tiers[1]",
        "increase",
    ),
    "bad-queue-type": (HEADER + job('type = "stream"'), "job_queue[0].type", "classic"),
    "bad-exchange-type": (
        '[[exchange]]\nname = "jobs"\ntype = "fan-out"\n' + job(),
        "exchange[0].type",
        "direct",
    ),
    "wrong-value-type": (HEADER + job('shards = "four"'), "job_queue[0].shards", "integer"),
    "missing-name": ('[[exchange]]\ntype = "direct"\n', "exchange[0].name", "required"),
    "reserved-name": ('[[exchange]]\nname = "amq.jobs"\n', "exchange[0].name", "reserved"),
    "breaker-marker": (HEADER + job(name="mail.breaker.x"), "job_queue[0].name", "circuit breaker"),
    "breaker-probe-marker": (HEADER + job(name="a.breaker-probe.b"), "job_queue[0].name", "circuit breaker"),
    "toml-syntax": (HEADER + "[[job_queue]\nname = 'x'\n", "-", "TOML"),
    "too-many-shards": (HEADER + job("shards = 1000"), "job_queue[0].shards", "less than or equal"),
    "priority-as-string": (HEADER + job('max_priority = "5"'), "job_queue[0].max_priority", "integer"),
    "priority-as-float": (HEADER + job("max_priority = 5.0"), "job_queue[0].max_priority", "integer"),
    "priority-as-bool": (HEADER + job("max_priority = true"), "job_queue[0].max_priority", "integer"),
    "duration-unit-twice": (HEADER + job('retry_tiers = ["5s5s"]'), "job_queue[0].retry_tiers[0]", "each unit once"),
    "expanded-name-too-long": (HEADER + job(name="x" * 250), "job_queue[0].name", "255"),
    "unicode-name-too-long": (HEADER + job(name="\U0001f680" * 62), "job_queue[0].name", "bytes"),
    # an empty list crashed the routing checks (IndexError: tuple index out of range) before it was named
    "routing-keys-empty": (HEADER + job("routing_keys = []"), "job_queue[0].routing_keys", "binds nothing"),
    "routing-keys-empty-sharded": (
        HEADER + job("routing_keys = []\nshards = 2"),
        "job_queue[0].routing_keys",
        "binds nothing",
    ),
    "routing-keys-empty-topic": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n' + job("routing_keys = []") + job(name="other"),
        "job_queue[0].routing_keys",
        "binds nothing",
    ),
    "routing-key-twice": (HEADER + job('routing_keys = ["a", "a"]'), "job_queue[0].routing_keys", "twice"),
    "routing-key-shared": (
        HEADER + job('routing_keys = ["k"]') + job('routing_keys = ["k"]', name="other"),
        "job_queue[1].routing_keys",
        "run twice",
    ),
    "hash-exchange-key": (
        '[[exchange]]\nname = "jobs"\ntype = "x-consistent-hash"\n' + job(),
        "job_queue[0].routing_keys",
        "weights",
    ),
    # Unicode digits (Arabic-Indic '١', full-width '５') are digits to str.isdigit() and \d, not to RabbitMQ
    # (helper-177: the weight passed the loader, apply declared the job queue, then the broker refused the binding)
    "hash-exchange-key-not-ascii": (
        '[[exchange]]\nname = "jobs"\ntype = "x-consistent-hash"\n' + job('routing_keys = ["\u0661"]'),
        "job_queue[0].routing_keys",
        "weights",
    ),
    # RabbitMQ: "The binding key must be greater than 0", after the job queue's queues were declared (helper-177)
    "hash-exchange-key-zero": (
        '[[exchange]]\nname = "jobs"\ntype = "x-consistent-hash"\n' + job('routing_keys = ["0"]'),
        "job_queue[0].routing_keys",
        "weights",
    ),
    "duration-not-ascii-digits": (HEADER + job('retry_tiers = ["\uff15s"]'), "job_queue[0].retry_tiers[0]", "duration"),
    "quarantine-loop": (
        HEADER + job() + '[[binding]]\nsource = "work.quarantine"\ndestination = "work"\n',
        "binding[0].destination",
        "loop",
    ),
    "shards-headers-exchange": (
        '[[exchange]]\nname = "jobs"\ntype = "headers"\n' + job("shards = 4"),
        "job_queue[0].shards",
        "direct or topic",
    ),
    "shards-fanout-exchange": (
        '[[exchange]]\nname = "jobs"\ntype = "fanout"\n' + job("shards = 2"),
        "job_queue[0].shards",
        "every shard",
    ),
    "shards-hash-exchange": (
        '[[exchange]]\nname = "jobs"\ntype = "x-consistent-hash"\n' + job('routing_keys = ["1"]\nshards = 2'),
        "job_queue[0].shards",
        "direct or topic",
    ),
    "shards-topic-wildcard-key": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n' + job('routing_keys = ["work.*"]\nshards = 2'),
        "job_queue[0].routing_keys",
        "wildcard",
    ),
    "shards-topic-wildcard-of-another-job-queue": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n'
        + job('routing_keys = ["work"]\nshards = 2')
        + job('routing_keys = ["work.#"]', name="other"),
        "job_queue[1].routing_keys",
        "work.shard-0",
    ),
    "topic-wildcard-of-another-job-queue": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n' + job() + job('routing_keys = ["#"]', name="other"),
        "job_queue[1].routing_keys",
        "publishers use for job queue 'work'",
    ),
    "direct-user-binding-copies-a-job-queue": (
        HEADER
        + job()
        + job(name="other")
        + '[[binding]]\nsource = "jobs"\ndestination = "other"\nrouting_key = "work"\n',
        "binding[0].routing_key",
        "publishers use for job queue 'work'",
    ),
    # review M4: an exchange-to-exchange binding passed job queue a's jobs on to job queue b
    "exchange-binding-passes-jobs-to-another-job-queue": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n\n[[exchange]]\nname = "e2"\ntype = "fanout"\n\n'
        + job(name="a")
        + '[[job_queue]]\nname = "b"\nexchange = "e2"\n\n'
        + '[[binding]]\nsource = "jobs"\ndestination = "e2"\ndestination_type = "exchange"\nrouting_key = "a"\n',
        "binding[0].routing_key",
        "binding of exchange 'jobs' to exchange 'e2' with key 'a' passes 'a', the routing key publishers use for "
        "job queue 'a', on to 'b'",
    ),
    "exchange-bindings-pass-jobs-on-transitively": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n\n[[exchange]]\nname = "e2"\ntype = "direct"\n\n'
        '[[exchange]]\nname = "e3"\ntype = "topic"\n\n'
        + job(name="a")
        + '[[job_queue]]\nname = "b"\nexchange = "e3"\nrouting_keys = ["#"]\n\n'
        + '[[binding]]\nsource = "jobs"\ndestination = "e2"\ndestination_type = "exchange"\nrouting_key = "*"\n\n'
        + '[[binding]]\nsource = "e2"\ndestination = "e3"\ndestination_type = "exchange"\nrouting_key = "a"\n',
        "binding[0].routing_key",
        "passes 'a', the routing key publishers use for job queue 'a', on to 'b'",
    ),
    # review L1: a binding into another job queue's quarantine queue
    "binding-into-a-quarantine-queue": (
        HEADER
        + job(name="a")
        + job(name="b")
        + '[[binding]]\nsource = "jobs"\ndestination = "a.quarantine"\nrouting_key = "b"\n',
        "binding[0].destination",
        "queue 'a.quarantine' is the quarantine queue of job queue 'a', which amqpjobs alone fills",
    ),
    "binding-into-a-retry-tier": (
        HEADER
        + job('retry_tiers = ["5s"]', name="a")
        + '[[binding]]\nsource = "jobs"\ndestination = "a.retry.5s"\nrouting_key = "x"\n',
        "binding[0].destination",
        "queue 'a.retry.5s' is a retry tier of job queue 'a', which amqpjobs alone fills",
    ),
    # h188: a binding into an app's ledger marker (x-max-length 0: what it routes there is dropped, confirmed)
    "binding-into-the-ledger-marker": (
        HEADER
        + job(name="amqpjobs.ledger.shop")  # the queue declared (as the scheduler's case is)
        + '[[binding]]\nsource = "jobs"\ndestination = "amqpjobs.ledger.shop"\nrouting_key = "x"\n',
        "binding[0].destination",
        "queue 'amqpjobs.ledger.shop' is the ledger marker of app 'shop', which holds nothing",
    ),
    # helper-194: a job queue named "x.quarantine" (no job queue "x") was applied, and every
    # quarantine command took its work queue for job queue x's quarantine: `quarantine purge
    # x.quarantine --yes` printed "purged 3 message(s) from x.quarantine", 3 jobs never run gone.
    **{
        f"job-queue-named-as-a-{kind}-queue": (HEADER + job(name=name), "job_queue[0].name", f"read as {words}")
        for kind, name, words in [
            ("quarantine", "x.quarantine", "the quarantine queue of job queue x"),
            ("parked", "x.parked", "the parked queue of job queue x"),
            ("suspects", "x.suspects", "the suspects queue of job queue x"),
            ("paused", "x.paused", "the pause flag of job queue x"),
            ("tier", "x.retry.5s", "retry tier 5s of work queue x"),
            ("shard", "x.shard-1", "shard 1 of job queue x"),
        ]
    },
    "job-queue-named-as-a-ledger-marker": (
        HEADER + job(name="amqpjobs.ledger.shop"),
        "job_queue[0].name",
        "'amqpjobs.ledger.shop' is the name of a queue of app 'shop' (its ledger marker)",
    ),
    "job-queue-named-as-a-scheduler-queue": (
        HEADER + job(name="amqpjobs.scheduler.shop.leader"),
        "job_queue[0].name",
        "(its scheduler's queues), which amqpjobs declares itself",
    ),
    "shards-topic-user-binding-reaches-two-shards": (
        '[[exchange]]\nname = "jobs"\ntype = "topic"\n'
        + job("shards = 2")
        + '[[binding]]\nsource = "jobs"\ndestination = "work.shard-1"\nrouting_key = "work.*"\n',
        "binding[0].routing_key",
        "shard",
    ),
    "shards-direct-user-binding-reaches-two-shards": (
        HEADER
        + job("shards = 2")
        + '[[binding]]\nsource = "jobs"\ndestination = "work.shard-1"\nrouting_key = "work.shard-0"\n',
        "binding[0].routing_key",
        "shard",
    ),
    # review M1: integers AMQP can't carry (a signed 64-bit field-table long) half-applied a topology
    "max-length-beyond-amqp": (
        HEADER + job('max_length = 99999999999999999999\noverflow = "drop-head"'),
        "job_queue[0].max_length",
        "9223372036854775807",
    ),
    "delivery-limit-beyond-amqp": (
        HEADER + job('type = "quorum"\ndelivery_limit = 9223372036854775808'),
        "job_queue[0].delivery_limit",
        "9223372036854775807",
    ),
    "max-depth-beyond-amqp": (
        HEADER + job("max_depth = 9223372036854775808"),
        "job_queue[0].max_depth",
        "9223372036854775807",
    ),
    "sub-millisecond-tiers": (
        HEADER + job("retry_tiers = [0.0001, 0.0004]"),
        "job_queue[0].retry_tiers[0]",
        "sub-millisecond",
    ),
    "empty-file": ("# nothing here\n", "-", "declares nothing"),
    "table-not-list": ('[exchange]\nname = "jobs"\n', "exchange", "[[exchange]]"),
}
