"""The ``amqpjobs`` console script (also ``python -m amqpjobs``): SIGTERM and SIGINT are held first.

It imports nothing before :func:`amqpjobs.runtime.held_signals.hold` but that module (the
package's ``__init__`` loads its names when first used): a signal while the CLI is imported
then stops a worker or scheduler replica well, and ends any other command as before.
"""

from __future__ import annotations

from amqpjobs.runtime import held_signals


def main() -> None:
    """Hold the signals, import the CLI, run it (click exits the process with the command's code)."""
    held_signals.hold()
    from amqpjobs.cli import main as cli
    from amqpjobs.cli._root import release_held_signals
    from amqpjobs.runtime.handler_threads import bound_if_wanted

    try:
        cli()
    except SystemExit as exc:  # a worker's process ends within the bound, whatever ended its command
        bound_if_wanted(exc.code)
        raise
    except BaseException:
        bound_if_wanted(1)
        raise
    finally:  # what never reached a command (--help, a usage error) still ends by a signal held meanwhile
        release_held_signals()


if __name__ == "__main__":
    main()
