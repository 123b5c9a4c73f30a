# The two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BROKER := bash scripts/broker.sh

.PHONY: postgres-up install broker-up broker-down broker-status broker4-up broker4-down broker43-up broker43-down lint node-deps browser-deps screenshots test test-3 test-4 test-43 test-fast demo clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,demo]'
	touch $@

install: $(BIN)/.installed  ## create .venv and install amqpjobs with its dev tools

broker-up:  ## start (or reuse) the project's RabbitMQ node and print its URLs
	$(BROKER) up

broker-down:  ## stop the project's RabbitMQ node
	$(BROKER) down

broker-status:
	$(BROKER) status

broker4-up:  ## start (or reuse) a RabbitMQ 4.x node (Debian 13 chroot) beside the 3.10 one
	bash scripts/broker4.sh up

broker4-down:
	bash scripts/broker4.sh down

broker43-up:  ## start (or reuse) a RabbitMQ 4.3.x node (Debian sid chroot) beside the others
	bash scripts/broker43.sh up

broker43-down:
	bash scripts/broker43.sh down

lint: install  ## ruff and mypy (strict)
	$(BIN)/ruff check amqpjobs amqpjobs_pytest tests examples bench scripts
	$(BIN)/ruff format --check amqpjobs amqpjobs_pytest tests examples bench scripts
	$(BIN)/mypy

# The three suites' parallel halves run one after the other (each in parallel itself, see tier);
# only the chroot builds of the two 4.x nodes overlap the 3.10 one (one after the other, and after
# the host's own apt-get installs of broker-up, postgres-up and node-deps: apt takes one lock at a
# time). Then the serial halves of all three run side by side, each with its own node (each stops or
# loads only its own; they mostly wait): first the serial tests of the three that depend on the
# broker's version (4-5 min each, some stop their node), then the ones run on 3.10 only, which stop
# no shared node (`version_independent`, or not broker-facing: 8-9 min alone), in three processes
# (see beside): 13 min of serial tests in 8, three side by side throughout, as before.
test: lint broker-up postgres-up node-deps browser-deps  ## install, start the brokers, lint, run the whole suite on RabbitMQ 3.10, the broker-facing suite on 4.0 and 4.3 (then stops the 3-node clusters the suites started)
	@mkdir -p .broker4 .broker43; rm -rf .test-results
	listening() { bash -c "exec 3<>/dev/tcp/127.0.0.1/$$1" 2>/dev/null; }; \
	if listening 5701; then c3=kept; else c3=ours; fi; if listening 5731; then c43=kept; else c43=ours; fi; \
	{ bash scripts/broker4.sh build >.broker4/build.log 2>&1 && \
	  bash scripts/broker43.sh build >.broker43/build.log 2>&1; } & builds=$$!; \
	rc=0; $(call tier,,,$(COVERED),3) || rc=1; \
	wait $$builds || { tail -30 .broker4/build.log .broker43/build.log; rc=1; }; \
	$(MAKE) broker4-up broker43-up || rc=1; \
	$(call tier,$(V4),AMQPJOBS_TEST_BROKER=4,,4) || rc=1; \
	$(call tier,$(V4),AMQPJOBS_TEST_BROKER=43,,43) || rc=1; \
	mkdir -p .test-results; $(call aside,$(V4),,$(COVERED),3) serial3=$$!; \
	$(call aside,$(V4),AMQPJOBS_TEST_BROKER=4,,4) serial4=$$!; \
	$(call serial,$(V4),AMQPJOBS_TEST_BROKER=43,,43) || rc=1; \
	wait $$serial4 $$serial3; $(call shown,4) || rc=1; $(call shown,3) || rc=1; \
	$(call beside,$(COVERED)) || rc=1; \
	[ $$c3 = kept ] || bash scripts/cluster.sh down >/dev/null 2>&1 || true; \
	[ $$c43 = kept ] || bash scripts/cluster43.sh down >/dev/null 2>&1 || true; \
	exit $$rc

postgres-up:  ## start (or reuse) the PostgreSQL cluster for the ledger tests
	bash scripts/postgres.sh up

node-deps:  ## node and npm (Debian's, when missing) and the pinned amqplib in .cache/node, for the Node publisher test
	bash scripts/node-deps.sh >/dev/null

browser-deps:  ## Debian's chromium (when missing), for the console's browser test (Playwright drives it)
	bash scripts/browser-deps.sh >/dev/null

screenshots: install browser-deps  ## PNGs of the console (overview, a group, a message) into docs/, from its browser test
	AMQPJOBS_SCREENSHOTS=$(CURDIR)/docs $(BIN)/pytest tests/integration/test_console_browser.py -q

# Each suite runs in TEST_WORKERS pytest-xdist processes (most tests wait on the broker, not the
# CPU; `--dist loadgroup` from pyproject keeps an `xdist_group` on one process), then the tests
# marked `serial` (they stop the node or assert wall-clock bounds) alone; exit 5 (no test
# selected) is not a failure there. TEST_WORKERS=4 on 2 cores: the tests wait far more than they compute.
# --durations=25: each suite ends with its slowest tests, where to look when the run grows (issue 29).
# --junitxml: each run's results in .test-results/<suite>[-serial].xml, from which .ci/run ends its
# log with every failed test of every suite (scripts/failures.py).
TEST_WORKERS ?= 4
# The 4.x suites' parallel halves (broker-facing tests only, no coverage) wait even more: 6 processes
# took 6:47 where 4 took 7:40 on RabbitMQ 4.0 (CPU idle a fifth of the time, against a third); the
# 3.10 one, with coverage and the unit tests, keeps both cores busy with 4 (idle 1% of the time; 6 took
# 23:41 without the chroot builds beside it, CI's 4 25:05 with them, and a wall-clock test failed).
TEST_WORKERS_4X ?= 6
# Coverage (pytest-cov, into .coverage) is measured on the 3.10 suite only: it slows a suite by a
# third on 2 cores (test_poison: 234 s against 174 s), and the 4.x suites run a subset of the same tests.
PYTEST := $(BIN)/pytest --durations=25
COVERED := --cov --cov-report=
# tier / serial (marker prefix, environment, coverage options, results name): a suite's two halves.
define tier
$(2) $(PYTEST) $(3) -n $(if $(1),$(TEST_WORKERS_4X),$(TEST_WORKERS)) -m "$(1)not serial" --junitxml=.test-results/$(4).xml
endef
define serial
{ $(2) $(PYTEST) $(3) $(if $(3),--cov-append) -m "$(1)serial" --junitxml=.test-results/$(4)-serial.xml || [ $$? -eq 5 ]; }
endef
# beside (coverage options): the serial tests of one version only (they stop no shared node) on 3.10,
# SERIAL_BESIDE processes side by side (the conftest lets a serial test run beside that many), one
# module to a process (`--dist loadfile`: a module's dedicated node is started once); results in
# .test-results/3-serial-beside.xml.
SERIAL_BESIDE := 3
define beside
{ AMQPJOBS_TEST_SERIAL_BESIDE=$(SERIAL_BESIDE) $(PYTEST) $(1) $(if $(1),--cov-append) -n $(SERIAL_BESIDE) --dist loadfile -m "serial and not ($(V4)serial)" --junitxml=.test-results/3-serial-beside.xml || [ $$? -eq 5 ]; }
endef
# aside / shown (same arguments): a serial half in the background, its output and exit status
# into .test-results/<name>-serial.log and .rc (then `$$!` is its PID); later its output, and its status.
define aside
{ $(call serial,$(1),$(2),$(3),$(4)) >.test-results/$(4)-serial.log 2>&1; echo $$? >.test-results/$(4)-serial.rc; } &
endef
define shown
echo "--- the $(1) serial tests (run beside the others) ---"; cat .test-results/$(1)-serial.log; [ "$$(cat .test-results/$(1)-serial.rc)" = 0 ]
endef
define run_suite
	rc=0; $(call tier,$(1),$(2),$(3),$(4)) || rc=1; $(call serial,$(1),$(2),$(3),$(4)) || rc=1; exit $$rc
endef
#: The 4.x suites' tests: the broker-facing ones that depend on the broker's version.
V4 := broker and not version_independent and 

test-3: install broker-up postgres-up node-deps browser-deps  ## the whole suite against the 3.10 node (coverage of amqpjobs/ into .coverage)
	$(call run_suite,,,$(COVERED),3)

test-4: install broker-up broker4-up postgres-up  ## the broker-facing suite against the 4.x node (not the version-independent tests)
	$(call run_suite,$(V4),AMQPJOBS_TEST_BROKER=4,,4)

test-43: install broker-up broker43-up postgres-up  ## the broker-facing suite against the 4.3.x node (not the version-independent tests)
	$(call run_suite,$(V4),AMQPJOBS_TEST_BROKER=43,,43)

test-fast: install broker-up  ## the suite without tests marked slow
	rc=0; $(BIN)/pytest -n $(TEST_WORKERS) -m "not slow and not serial" || rc=1; \
	$(BIN)/pytest -m "not slow and serial" || rc=1; exit $$rc

demo: install broker-up  ## run the main job against the real broker
	$(BIN)/python examples/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: bench
bench: install broker-up  ## every benchmark of issue 9 against the peers and issue 22's goals (closing table), written to bench/RESULTS.md (N=20000 by default; BENCH_ARGS="--quick" for a smoke run)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/run.py $(BENCH_ARGS)
