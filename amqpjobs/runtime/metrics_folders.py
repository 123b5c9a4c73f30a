"""The ``--processes`` supervisor's metrics folder, and the removal of the folders killed supervisors left.

prometheus_client's multiprocess mode (README "Several worker processes") keeps each child's
counts in files of one folder, ``<temp>/amqpjobs-metrics-<supervisor pid>-<random>`` (the temp
folder is ``$TMPDIR``, else ``/tmp``). A supervisor removes its own at its stop; one killed
(SIGKILL, the OOM killer) can't, so each start removes the folders of supervisors that are gone
and whose children have ended too (the pid in each file's name, ``counter_<pid>.db``). Folders of
other users, and those named without a pid (made by amqpjobs before this rule), are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

#: Every metrics folder's name begins with this.
PREFIX = "amqpjobs-metrics-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-")
_FILE_PID = re.compile(r"_(\d+)\.db$")


def new_folder() -> str:
    """A new metrics folder for this process's children (its path), after removing those left behind.

    Raises:
        OSError: the temp folder can't be written (:func:`tempfile.mkdtemp`).
    """
    remove_left_behind()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def remove_left_behind(root: str | None = None) -> list[str]:
    """Remove the metrics folders in ``root`` (default: the temp folder) whose supervisor and children are gone.

    Returns:
        The paths removed. Raises nothing: a folder that can't be read or removed is left.
    """
    removed: list[str] = []
    with contextlib.suppress(OSError), os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            owner = _OWNED.match(entry.name)
            with contextlib.suppress(OSError):
                if owner is None or not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _running(int(owner.group(1))):
                    continue
                files = os.listdir(entry.path)
                if any(_running(int(m.group(1))) for name in files if (m := _FILE_PID.search(name))):
                    continue  # a child of the killed supervisor still drains
                shutil.rmtree(entry.path)
                removed.append(entry.path)
    return removed


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's too)."""
    if pid <= 0:  # no process's: 0 and -1 would signal groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
