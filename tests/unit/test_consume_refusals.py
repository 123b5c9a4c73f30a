"""``consume --processes 2`` refuses what every child would refuse at its start: at once, no child started.

Each bad input runs ``amqpjobs consume`` as a user would, with ``--processes 1`` (one worker, no
supervisor) and ``--processes 2`` (the supervisor): both must print the same ``error:`` line and
exit with the same code, and the supervisor must start no child (its ``child N started (pid P)``
lines). No broker is needed: every one of these is refused before a worker connects (the URL
points at port 1, where nothing listens).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.topologies import work_topology

TOPOLOGY = work_topology("mail", flat=("flat",))

APP_MODULE = """
from pathlib import Path

from amqpjobs import App, RetryPolicy

HERE = Path(__file__).parent
app = App("refusals", topology=str(HERE / "topology"))
app.job("send", queue="work")(lambda payload, ctx: None)
app.job("mail", queue="mail")(lambda payload, ctx: None)

NOT_AN_APP = 42

no_tiers = App("no-tiers", topology=str(HERE / "topology"))
no_tiers.job("x", queue="flat", retry=RetryPolicy(max_attempts=3))(lambda payload, ctx: None)

no_topology = App("no-topology", topology=str(HERE / "nowhere"))
no_topology.job("x", queue="work")(lambda payload, ctx: None)

no_jobs = App("no-jobs", topology=str(HERE / "topology"))  # its jobs live in a module nobody imported
"""

CASES = [
    pytest.param(
        ["refusalapp:app", "--queues", "nosuch"],
        "error: job queue 'nosuch' is not in the topology (loaded from {topology}); known: flat, mail, work",
        id="unknown-queue",
    ),
    pytest.param(
        ["refusalapp:app", "--queues", "work,nosuch"],
        "error: job queue 'nosuch' is not in the topology (loaded from {topology}); known: flat, mail, work",
        id="one-unknown-of-two",
    ),
    # helper-194: was a worker consuming 'flat' that quarantined each job there as unknown-job
    # ("job 'b.ok' is not served from job queue 'other' by app 'a'"), beside the app that serves them
    pytest.param(
        ["refusalapp:app", "--queues", "work,flat"],
        "error: app 'refusals' serves no job from job queue 'flat' (its jobs use: mail, work): a worker "
        "consuming it would quarantine each of its jobs as unknown-job; leave it out of --queues, or run "
        "the app whose jobs use it",
        id="queue-the-app-serves-no-job-from",
    ),
    # helper-194: was "worker consuming nothing with 0 slot(s)", running until stopped, exit 0
    pytest.param(
        ["refusalapp:no_jobs"],
        "error: app 'no-jobs' has no jobs: no @app.job was registered when its module was imported, so a "
        "worker would consume nothing; import the modules that define its jobs in the app's module",
        id="app-without-jobs",
    ),
    pytest.param(
        ["refusalapp:app", "--queues", " , "],
        "error: --queues names no job queue: give them comma-separated (e.g. --queues mail,billing), "
        "or leave the option out to consume every job queue the app's jobs use",
        id="no-queue-named",
    ),
    pytest.param(
        ["refusalapp"],
        "error: 'refusalapp': give the app as module:attribute, e.g. examples.shop:app",
        id="no-attribute",
    ),
    pytest.param(
        ["nosuchmodule:app"],
        "error: cannot import module 'nosuchmodule': No module named 'nosuchmodule'",
        id="no-such-module",
    ),
    pytest.param(
        ["refusalapp.py:app"],  # was Python's own "No module named 'refusalapp.py'; 'refusalapp' is not a package"
        "error: cannot import module 'refusalapp.py': 'refusalapp.py' is a file path, not a module name: give "
        "refusalapp:app (run from the directory that holds refusalapp.py, or add that directory to PYTHONPATH)",
        id="file-name-for-module",
    ),
    pytest.param(
        ["../elsewhere/x:app"],  # was "No module named '..'" with no hint (helper-194)
        "error: cannot import module '../elsewhere/x': '../elsewhere/x' is a file path, not a module name: give "
        "x:app (run from the directory that holds x.py, or add that directory to PYTHONPATH)",
        id="path-for-module",
    ),
    pytest.param(
        ["refusalapp:nope"],
        "error: module 'refusalapp' has no attribute 'nope'",
        id="no-such-attribute",
    ),
    pytest.param(
        ["refusalapp:NOT_AN_APP"],
        "error: 'refusalapp:NOT_AN_APP' is an int, not an amqpjobs App",
        id="not-an-app",
    ),
    pytest.param(
        ["refusalapp:no_tiers"],
        "error: job 'x' allows 3 attempts but job queue 'flat' has no retry_tiers; add tiers to the topology "
        "or set RetryPolicy(max_attempts=1)",
        id="attempts-without-tiers",
    ),
    pytest.param(
        ["refusalapp:no_topology"],
        None,  # the loader's own words; the same in both
        id="no-topology",
    ),
    pytest.param(
        ["badledgerapp:app"],
        # was "error: importing module 'badledgerapp' failed: ConfigurationError: PostgresLedger(dsn=...) ..." (h188)
        "error: PostgresLedger(dsn=...) is not a URL "
        "(postgresql://...) nor keyword=value pairs (host=... dbname=...): give the database's URL, "
        "postgresql://user:***@host:5432/dbname (or libpq keyword=value pairs)",
        id="module-raises-a-configuration-error",
    ),
    pytest.param(
        ["missingdepapp:app"],
        # was "cannot import module 'missingdepapp': No module named ...": read as the module not found (helper-177)
        "error: importing module 'missingdepapp' failed: it imports 'no_such_dependency', which is not installed "
        "(No module named 'no_such_dependency'): install it in this environment, or fix the import",
        id="module-imports-a-missing-package",
    ),
    pytest.param(
        ["refusalapp:app", "--grace", "soon"],
        None,
        id="bad-grace",
    ),
    pytest.param(
        ["refusalapp:app", "--consumer-timeout", "-5s"],
        None,
        id="bad-consumer-timeout",
    ),
]


def consume(tmp_path: Path, args: list[str], processes: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/",  # nothing listens: a worker that connects fails (exit 3)
    }
    exe = Path(sys.executable).with_name("amqpjobs")
    return subprocess.run(
        [str(exe), "consume", *args, "--processes", processes],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


def error_of(stderr: str) -> str:
    """What the command printed from its ``error:`` line on (a topology's problems follow on lines of their own)."""
    lines = stderr.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, stderr
    return "".join(lines[starts[0] :])


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "t.toml").write_text(TOPOLOGY)
    (tmp_path / "refusalapp.py").write_text(APP_MODULE)
    (tmp_path / "badledgerapp.py").write_text(
        "from amqpjobs import App\nfrom amqpjobs.runtime.ledger_postgres import PostgresLedger\n"
        "app = App('bad-ledger', topology='topology', ledger=PostgresLedger('nonsense'))\n"
    )
    (tmp_path / "missingdepapp.py").write_text("import no_such_dependency\n")
    return tmp_path


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_the_supervisor_refuses_what_a_single_worker_refuses_before_any_child_starts(
    app_dir: Path, args: list[str], expected: str | None
) -> None:
    one = consume(app_dir, args, "1")
    two = consume(app_dir, args, "2")
    assert one.returncode == 2, one.stderr
    assert two.returncode == one.returncode, two.stderr
    said = error_of(one.stderr)
    if expected is not None:
        assert said == expected.format(topology=app_dir / "topology") + "\n"
    assert error_of(two.stderr) == said, two.stderr
    assert "started (pid" not in two.stderr, two.stderr  # the supervisor started no child
    assert "exited before it was ready" not in two.stderr, two.stderr


MODULES = {
    "raises_runtime": "raise RuntimeError('a service is down')",
    "reads_env": "import os\nos.environ['AMQPJOBS_NO_SUCH_VARIABLE_AT_ALL']",
    "raises_ours": "from amqpjobs import ConfigurationError\nraise ConfigurationError('bad setting')",
    "bad_topology": (
        "from amqpjobs.topology.loader import load_topology\nload_topology(__import__('pathlib').Path('nowhere'))"
    ),
    "imports_missing": "import no_such_dependency_at_all",
    "bad_syntax": "def broken(:\n    pass",
    "imports_bad_syntax": "import bad_syntax",
    "not_an_app": "app = 1",
    "an_app": "from amqpjobs import App\napp = App('ok', topology='topology')",
    "exits_at_import": "import sys\nsys.exit(7)",
    "raises_broker": "from amqpjobs.errors import BrokerUnavailableError\nraise BrokerUnavailableError('down')",
}


@pytest.mark.parametrize(
    ("reference", "passing"),
    [
        ("raises_runtime:app", True),  # the module's own code: may pass (the children's crash loop decides)
        ("reads_env:app", True),
        ("exits_at_import:app", True),  # sys.exit() in the module's own code: its failure, like a raise
        ("raises_ours:app", False),  # a configuration error of ours: the same at every try
        ("raises_broker:app", True),  # the broker failing while the module imports: may pass (h188: passed unchanged)
        ("bad_topology:app", False),
        ("imports_missing:app", False),
        ("bad_syntax:app", False),  # a syntax error never passes (helper-172: 10 child starts, then the crash loop)
        ("imports_bad_syntax:app", False),
        ("no_such_module_here:app", False),
        ("not_an_app:app", False),
        ("an_app:nope", False),
        ("an_app", False),
    ],
)
def test_only_the_app_modules_own_failure_is_left_to_the_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: str, passing: bool
) -> None:
    from amqpjobs.errors import AmqpJobsError
    from amqpjobs.runtime.loading import load_app, raised_by_module

    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(AmqpJobsError) as caught:
            load_app(reference)
    finally:
        for name in MODULES:
            sys.modules.pop(name, None)
    assert raised_by_module(caught.value) is passing, repr(caught.value)


def test_a_store_unavailable_while_the_module_imports_is_left_to_the_children() -> None:
    from amqpjobs.errors import LedgerUnavailableError, ResultsUnavailableError
    from amqpjobs.runtime.loading import raised_by_module

    assert raised_by_module(LedgerUnavailableError("the PostgreSQL ledger is unreachable"))
    assert raised_by_module(ResultsUnavailableError("the results store is unreachable"))


@pytest.mark.parametrize("code", ["7", "0", "'DATABASE_URL is not set'"])
def test_a_module_that_calls_sys_exit_while_imported_is_an_import_error_exit_2(tmp_path: Path, code: str) -> None:
    """Was: the CLI ended with the module's exit code (7, 0, or 1 with its text), no line of ours (helper-177)."""
    (tmp_path / "exitapp.py").write_text(f"import sys\nsys.exit({code})\n")
    exe = Path(sys.executable).with_name("amqpjobs")
    env = {**os.environ, "AMQPJOBS_URL": "amqp://guest:guest@127.0.0.1:1/"}
    for args in (["consume", "exitapp:app"], ["quarantine", "show", "work", "--app", "exitapp:app"]):
        done = subprocess.run(
            [str(exe), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert error_of(done.stderr) == (
            f"error: importing module 'exitapp' failed: it called sys.exit({code}) while imported "
            "(a module an app is loaded from must not end the program: raise an exception instead)\n"
        ), done.stderr
