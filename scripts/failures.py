"""Print the tests that failed or errored in the last `make test`, from its JUnit XML files.

Run by .ci/run last, so the end of a CI log (often all that is kept of it) names every failure
of every suite, not just the last suite's summary. Each line: the suite (the file's name,
`3`, `3-serial`, `4`, ...), the test id, and the first line of the failure's message; then
the last lines of its traceback. Characters that are not printable (control characters,
terminal escapes from a test's output) are escaped, so nothing can forge or hide a line.
Exit 0 always, whatever the files hold: the suites' own exit codes decide the run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Traceback lines kept per failure (its end: the assertion and its values).
TAIL = 12
#: Characters kept of each printed line (after escaping), and failures listed per suite: a
#: mass failure must not push the other suites' out of a log kept by its tail.
WIDTH = 300
MOST = 20


def shown(text: str) -> str:
    """``text`` with every character that is not printable (control characters, terminal escapes) escaped."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if len(out) <= WIDTH else out[: WIDTH - 1] + "…"


def failures(path: Path) -> tuple[int, list[tuple[str, str, str]]]:
    """How many test cases ``path`` holds, and (test id, message's first line, traceback tail) of each that failed."""
    found = []
    cases = list(ET.parse(path).iter("testcase"))
    for case in cases:
        for kind in ("failure", "error"):
            for bad in case.iter(kind):
                test = shown(f"{case.get('classname', '')}::{case.get('name', '')}")
                message = [line for line in (bad.get("message") or "").splitlines() if line.strip()] or [kind]
                tail = "\n".join(shown(line) for line in (bad.text or "").rstrip().splitlines()[-TAIL:])
                found.append((test, shown(f"{kind}: {message[0][: WIDTH * 4]}"), tail))
    return len(cases), found


def main() -> int:
    """Print each suite's failures (or that it had none, or no results); 0 always.

    Arguments: the results folder (default ``.test-results``), then the suites expected, by
    name (``3 3-serial 4 ...``): one without its file is reported as never run or cut off.
    """
    sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".test-results"
    expected = sys.argv[2:]
    if not folder.is_dir():
        print(f"failures: no results folder {shown(str(folder))} (no suite ran, or a file was given)")
        folder_files: list[Path] = []
    else:
        folder_files = sorted(folder.glob("*.xml"))
    files = {path.stem: path for path in folder_files}
    if not files and not expected:
        if folder.is_dir():
            print(f"failures: no JUnit XML in {shown(str(folder))}")
        return 0
    for name in [*expected, *(stem for stem in files if stem not in expected)]:
        path = files.get(name)
        if path is None:
            print(f"suite {shown(name)}: no results ({name}.xml missing: the suite did not run, or was cut off)")
            continue
        if not path.is_file() and path.exists() and not path.is_dir():  # a FIFO or device: reading could wait forever
            print(f"suite {shown(name)}: unreadable JUnit XML ({shown(path.name)} is not a regular file)")
            continue
        try:
            cases, found = failures(path)
        except (ET.ParseError, OSError) as exc:
            print(f"suite {shown(name)}: unreadable JUnit XML ({shown(str(exc))})")
            continue
        if not cases:
            print(f"suite {shown(name)}: no test cases in {shown(path.name)} (not JUnit XML, or no test ran)")
            continue
        print(f"suite {shown(name)}: {len(found)} of {cases} failed or errored")
        for test, message, tail in found[:MOST]:
            print(f"  {test}\n    {message}")
            for line in tail.splitlines():
                print(f"      {line}")
        if len(found) > MOST:
            print(f"  ... and {len(found) - MOST} more (the suite's own summary in the log lists them)")
    return 0


def run() -> int:
    """:func:`main`; a reader that goes away (``| head``) ends it quietly (``signal`` docs, "Note on SIGPIPE")."""
    if sys.stdout is None:  # started with stdout closed (>&-): nowhere to say anything
        return 0
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:  # a full disk (/dev/full), a closed descriptor: the suites' exit codes still decide
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError, AttributeError):
            sys.stderr.write(f"failures: can't write the report: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
