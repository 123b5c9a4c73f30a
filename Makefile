# The two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BROKER := bash scripts/broker.sh

.PHONY: install broker-up broker-down broker-status lint test test-fast demo clean

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

lint: install  ## ruff and mypy (strict)
	$(BIN)/ruff check amqpjobs tests examples bench
	$(BIN)/ruff format --check amqpjobs tests examples bench
	$(BIN)/mypy

test: install broker-up lint  ## install, start the broker, lint, run the whole suite
	$(BIN)/pytest

test-fast: install broker-up  ## the suite without tests marked slow
	$(BIN)/pytest -m "not slow"

demo: install broker-up  ## run the main job against the real broker
	$(BIN)/python examples/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
