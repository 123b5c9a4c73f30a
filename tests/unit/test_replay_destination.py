"""Where a quarantined message goes back to (jobs.replay_plan.destination): the one home of the rule, no broker."""

from __future__ import annotations

import pytest

from amqpjobs.jobs.replay_plan import ReplayOptions, destination, unserved
from amqpjobs.topology.models import JobQueueSpec, Topology

UNSHARDED = {lay.name: lay for lay in Topology(job_queues=(JobQueueSpec(name="work", exchange="jobs"),)).layouts()}
SHARDED = {
    lay.name: lay for lay in Topology(job_queues=(JobQueueSpec(name="orders", exchange="jobs", shards=4),)).layouts()
}


@pytest.mark.parametrize("layouts", [None, UNSHARDED])
@pytest.mark.parametrize(
    ("named", "target"),
    [
        ("work", "work"),
        ("work.retry.30s", "work"),
        ("work.quarantine", "work"),
        ("work.suspects", "work"),
        ("work.parked", "work"),
        ("work.rate-waiting.sms", "work"),
        ("other.shard-2.retry.5s", "other.shard-2"),  # a tier of a shard: that shard, named in the tier's name
    ],
)
def test_a_queue_that_holds_jobs_but_runs_none_sends_them_to_its_work_queue(named, target, layouts):
    goes = destination(named, "job-1", None, layouts)
    assert goes.route is not None
    assert (goes.route.exchange, goes.route.routing_key, goes.route.target, goes.skip) == ("", target, target, "")
    assert bool(goes.why) is (named != "work")


def test_the_why_names_the_queue_and_what_it_is():
    goes = destination("work.retry.30s", "job-1", None, None)
    assert goes.why == (
        "its evidence names work.retry.30s, retry tier 30s of work queue work (job queue work), which runs no jobs: "
        "back to its work queue"
    )


@pytest.mark.parametrize("named", ["orders.quarantine", "orders.suspects", "orders.parked"])
def test_a_sharded_job_queue_of_the_app_picks_the_shard_by_the_shard_rule(named):
    layout = SHARDED["orders"]
    goes = destination(named, "tenant-a", None, SHARDED)
    exchange, routing_key = layout.publish_target("tenant-a")
    assert goes.route is not None
    assert (goes.route.exchange, goes.route.routing_key) == (exchange, routing_key)
    assert goes.route.target == layout.work_queue_for(routing_key)
    assert goes.route.target in layout.work_queues


def test_without_the_app_a_sharded_job_queue_goes_to_its_name_which_the_replay_then_finds_missing():
    goes = destination("orders.quarantine", "tenant-a", None, None)
    assert goes.route is not None
    assert goes.route.target == "orders"


@pytest.mark.parametrize(
    ("named", "words"),
    [
        ("work.paused", "the pause flag of job queue work"),
        ("amqpjobs.scheduler.shop.leader", "a scheduler queue of app shop"),
        ("amqpjobs.scheduler.shop.ticks.nightly", "a scheduler queue of app shop"),
        ("work.breaker.mail", "job mail's breaker queue in job queue work"),
        ("work.rate-tokens.sms", "job sms's tokens queue in job queue work"),
    ],
)
def test_any_other_queue_of_ours_holds_no_jobs_and_the_message_stays(named, words):
    goes = destination(named, "job-1", None, UNSHARDED)
    assert (goes.route, goes.skip) == (None, "no-work-queue")
    assert goes.problem == f"its evidence names {named}, {words}, which runs no jobs: replay it with --to QUEUE"


def test_to_wins_and_the_other_skips_keep_their_kinds():
    to = destination("work.paused", "job-1", "work", None)
    assert to.route is not None
    assert (to.route.target, to.why, to.skip) == ("work", "", "")
    assert destination("", "job-1", None, None).skip == "no-origin"
    assert destination("w" * 300, "job-1", None, None).skip == "far"


@pytest.mark.version_independent
def test_a_job_the_app_does_not_serve_from_its_job_queue_stays_with_the_fix():
    served = {"mail": "work", "moved": "other"}
    options = ReplayOptions(job_queues=served, app="shop")
    assert unserved("mail", "work", options) is None
    assert unserved("report", "work", options) == (
        "app 'shop' has no job 'report': its workers would quarantine it again as unknown-job; replay it with --app "
        "of the app that runs it, or without --app"
    )
    assert unserved("moved", "work", options) == (
        "app 'shop' serves job 'moved' from job queue 'other', not from 'work' where its evidence sends it: its "
        "workers would quarantine it again as unknown-job; replay it with --job moved --to other"
    )
    assert "(it has no jobs: no @app.job was registered" in (unserved("a", "work", ReplayOptions(job_queues={})) or "")
    assert unserved("report", "work", ReplayOptions()) is None  # no --app: unknown, it goes
    assert unserved("report", "work", ReplayOptions(job_queues=served, to="work")) is None  # --to: checked before
