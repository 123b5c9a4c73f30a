"""Print the tests that failed or errored in the last `make test`, from its JUnit XML files.

Run by .ci/run last, so the end of a CI log (often all that is kept of it) names every failure
of every suite, not just the last suite's summary. Each line: the suite (the file's name,
`3`, `3-serial`, `4`, ...), the test id, and the first line of the failure's message; then
the last lines of its traceback. Characters that are not printable (control characters,
terminal escapes from a test's output) are escaped, so nothing can forge or hide a line.
Exit 0 always, whatever the files hold: the suites' own exit codes decide the run.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Traceback lines kept per failure (its end: the assertion and its values).
TAIL = 12


def shown(text: str) -> str:
    """``text`` with every character that is not printable (control characters, terminal escapes) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def failures(path: Path) -> list[tuple[str, str, str]]:
    """(test id, first line of the message, traceback tail) of each failed or errored test case in ``path``."""
    found = []
    for case in ET.parse(path).iter("testcase"):
        for kind in ("failure", "error"):
            for bad in case.iter(kind):
                test = shown(f"{case.get('classname', '')}::{case.get('name', '')}")
                message = (bad.get("message") or kind).splitlines() or [kind]
                tail = "\n".join(shown(line) for line in (bad.text or "").rstrip().splitlines()[-TAIL:])
                found.append((test, shown(f"{kind}: {message[0][:300]}"), tail))
    return found


def main() -> int:
    """Print each suite's failures (or that it had none); 0 always."""
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".test-results"
    files = sorted(folder.glob("*.xml"))
    if not files:
        print(f"failures: no JUnit XML in {folder}")
        return 0
    for path in files:
        try:
            found = failures(path)
        except (ET.ParseError, OSError) as exc:
            print(f"suite {shown(path.stem)}: unreadable JUnit XML ({shown(str(exc))})")
            continue
        print(f"suite {shown(path.stem)}: {len(found)} failed or errored")
        for test, message, tail in found:
            print(f"  {test}\n    {message}")
            for line in tail.splitlines():
                print(f"      {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
