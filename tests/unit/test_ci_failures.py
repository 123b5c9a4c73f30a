"""scripts/failures.py: the end of a CI log names each failed or errored test of each suite."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAILURES = str(ROOT / "scripts" / "failures.py")

SUITE = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")

def test_passes():
    assert 1 == 1

def test_fails():
    used = 0
    assert used == 6, f"{used} token(s) used for 6 start(s)"

def test_errors(broken):
    pass
"""


def test_failures_names_each_failed_and_errored_test_with_its_message_and_says_when_a_suite_had_none(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(SUITE)
    (tmp_path / "test_clean.py").write_text("def test_ok():\n    assert True\n")
    results = tmp_path / "results"
    for suite, target in (("3", "test_sample.py"), ("4-serial", "test_clean.py")):
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:amqpjobs",
             f"--junitxml={results / f'{suite}.xml'}", target],
            cwd=tmp_path, capture_output=True, check=False,
        )  # fmt: skip
    (results / "43.xml").write_text("<testsuites><testsuite")  # a run cut off mid-write
    (results / "5.xml").mkdir()  # not a file
    (results / "7.xml").write_text("<coverage><packages/></coverage>")  # well-formed, but no JUnit
    (results / "8.xml").write_text("<testsuites><testsuite/></testsuites>")  # no test ran
    (results / "6.xml").write_text(  # a terminal escape (C1 CSI, which XML allows) in a test id, message and traceback
        '<testsuites><testsuite><testcase classname="t" name="x&#155;2J&#10;y">'
        '<failure message="red &#155;31m text">tb &#155;0m end</failure></testcase></testsuite></testsuites>'
    )
    expected = ["3", "3-serial", "4-serial"]
    done = subprocess.run([sys.executable, FAILURES, str(results), *expected], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lines = out.splitlines()
    assert lines[0] == "suite 3: 2 of 3 failed or errored"
    assert "suite 3-serial: no results (3-serial.xml missing: the suite did not run, or was cut off)" in lines
    assert "  test_sample::test_fails" in lines
    assert "    failure: AssertionError: 0 token(s) used for 6 start(s)" in lines
    assert "  test_sample::test_errors" in lines
    assert any(line.startswith("    error: failed on setup") for line in lines), out
    assert any("RuntimeError: the fixture broke" in line for line in lines), out
    assert "test_passes" not in out
    assert "suite 4-serial: 0 of 1 failed or errored" in lines
    assert any(line.startswith("suite 43: unreadable JUnit XML") for line in lines), out
    assert any(line.startswith("suite 5: unreadable JUnit XML ([Errno 21] Is a directory") for line in lines), out
    assert "suite 7: no test cases in 7.xml (not JUnit XML, or no test ran)" in lines
    assert "suite 8: no test cases in 8.xml (not JUnit XML, or no test ran)" in lines
    assert "  t::x\\x9b2J\\ny" in lines, out
    assert "    failure: red \\x9b31m text" in lines, out
    assert "      tb \\x9b0m end" in lines, out
    assert "\x9b" not in out


def test_failures_says_so_when_there_is_no_result_file(tmp_path: Path):
    out = subprocess.run([sys.executable, FAILURES, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out == f"failures: no JUnit XML in {tmp_path}\n"


def test_failures_lists_at_most_20_per_suite_and_cuts_long_lines(tmp_path: Path):
    cases = "".join(
        f'<testcase classname="t" name="n{i}"><failure message="{"x" * 5000}">{"y" * 5000}</failure></testcase>'
        for i in range(25)
    )
    (tmp_path / "3.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    out = subprocess.run([sys.executable, FAILURES, str(tmp_path), "3"], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "suite 3: 25 of 25 failed or errored"
    assert [line for line in lines if line.startswith("  t::")] == [f"  t::n{i}" for i in range(20)]
    assert lines[-1] == "  ... and 5 more (the suite's own summary in the log lists them)"
    assert max(len(line) for line in lines) == 6 + 300  # the indent, then 299 characters and "…"


def test_failures_ends_quietly_when_its_reader_goes_away(tmp_path: Path):
    case = '<testcase classname="t" name="n{}"><failure message="m">tb</failure></testcase>'
    cases = "".join(case.format(i) for i in range(20))
    for suite in range(40):
        (tmp_path / f"{suite}.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    done = subprocess.run(  # `| head -1`: the reader reads one line and closes the pipe
        f"{shlex.quote(sys.executable)} {shlex.quote(str(FAILURES))} {shlex.quote(str(tmp_path))} | head -1",
        shell=True, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.stdout == "suite 0: 20 of 20 failed or errored\n"
    assert done.stderr == ""


def test_failures_survives_a_stdout_it_cannot_write_and_a_fifo_and_names_a_missing_folder(tmp_path: Path):
    (tmp_path / "3.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="n">'
        '<failure message="&#10;  &#10;AssertionError: the real reason">tb</failure>'
        "</testcase></testsuite></testsuites>"
    )
    os.mkfifo(tmp_path / "4.xml")  # nobody writes it: reading it would wait forever
    run = [sys.executable, FAILURES, str(tmp_path), "3", "4"]
    out = subprocess.run(run, capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    assert "    failure: AssertionError: the real reason" in out  # the first line that says something
    assert "suite 4: unreadable JUnit XML (4.xml is not a regular file)" in out
    for how in ("2>&1 >&-", "2>&1 >/dev/full"):  # stdout closed, a full disk
        done = subprocess.run(
            " ".join([*map(shlex.quote, run), how]), shell=True, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, (how, done.stdout)
        assert "Traceback" not in done.stdout, how
    missing = tmp_path / "nothing-here"
    gone = subprocess.run([sys.executable, FAILURES, str(missing), "3"], capture_output=True, text=True, check=True)
    assert gone.stdout.splitlines() == [
        f"failures: no results folder {missing} (no suite ran, or a file was given)",
        "suite 3: no results (3.xml missing: the suite did not run, or was cut off)",
    ]
