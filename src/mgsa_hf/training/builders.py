"""Who is building a folder that other processes wait for (a prepared corpus, the run's tokenizer), and whether it
still runs.

The process that builds `<folder>` announces it in `<folder>.building`: its host, its process id, an attempt token
and a beat count that a thread of the process raises every [`HEARTBEAT_SECONDS`]. A waiting process ([`wait_for`])
reads that record. It stops with an error naming the builder when the builder has ended without finishing: at once
on the builder's own host (its process is gone), and on another host once the beat has not moved for
[`STALE_HEARTBEATS`] periods. A build that fails leaves `<folder>.failed` with its error and attempt. A waiter obeys
only a failure of the current attempt: one written after the waiter started, or by a process that still runs.
A failure or a record left by an earlier launch (a run stopped with Ctrl-C, or killed) is named in a warning and
not obeyed. Nothing here reads the clock of another machine: a waiter times the beat with its own clock.

A build writes into `<folder>.staging-<host>-<pid>` (and folders named after it). The next build removes those of
processes that have ended, and says so ([`remove_dead_staging`]).
"""

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from transformers.utils import logging


logger = logging.get_logger(__name__)

# how often a builder raises its beat, and after how many periods without a beat a builder on another host is dead
HEARTBEAT_SECONDS, STALE_HEARTBEATS = 5.0, 12
_STAGING = re.compile(r"\.staging-(?:(?P<host>.+)-)?(?P<pid>\d+)(?:-[a-z]+)?$")


def building_record(folder: Path) -> Path:
    """`<folder>.building`: the record of the process that builds `folder`."""
    return folder.with_name(folder.name + ".building")


def failure_marker(folder: Path) -> Path:
    """`<folder>.failed`: the error of the build of `folder` that failed."""
    return folder.with_name(folder.name + ".failed")


def staging_folder(folder: Path) -> Path:
    """Where this process builds `folder`: `<folder>.staging-<host>-<pid>`."""
    return folder.with_name(f"{folder.name}.staging-{socket.gethostname()}-{os.getpid()}")


def _alive_here(host: str | None, pid: int) -> bool | None:
    """Whether process `pid` of `host` runs; None for a process of another host (this one cannot see it)."""
    if host is not None and host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _record_alive(record: dict) -> bool | None:
    """Whether the process a record or failure marker names runs (see [`_alive_here`]); False for one that names
    none (an old marker)."""
    pid = record.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    return _alive_here(record.get("host"), pid)


def _read(path: Path) -> dict | None:
    """A record (JSON) or failure marker; a marker in the old form (one line of text) as `{"error": text}`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return {"error": text.strip()} if text.strip() else None
    return record if isinstance(record, dict) else {"error": text.strip()}


def _write(path: Path, record: dict) -> None:
    """Write `record` whole: beside `path`, then renamed over it."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(partial, path)


def _describe(record: dict) -> str:
    if "pid" not in record:
        return "a process it does not name"
    return f"process {record['pid']} on {record.get('host', '?')}"


@contextlib.contextmanager
def building(folder: Path) -> Iterator[None]:
    """
    Announce, for the `with` block, that this process builds `folder` (see the module's docstring): the record and its
    beat, and on an error the failure marker (written before the record goes, so a waiter reads the error, not a
    dead builder). An earlier failure marker is removed first.
    """
    record_path, failed = building_record(folder), failure_marker(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    failed.unlink(missing_ok=True)
    record = {"host": socket.gethostname(), "pid": os.getpid(), "attempt": secrets.token_hex(8),
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "every": HEARTBEAT_SECONDS,
              "beat": 0}
    _write(record_path, record)
    stop = threading.Event()

    def beat():
        while not stop.wait(record["every"]):
            record["beat"] += 1
            with contextlib.suppress(OSError):  # a missed beat; a full disk is the build's own error
                _write(record_path, record)

    thread = threading.Thread(target=beat, name=f"heartbeat {folder.name}", daemon=True)
    thread.start()
    try:
        yield
    except BaseException as error:
        _write(failed, {"error": f"{type(error).__name__}: {error}", "host": record["host"], "pid": record["pid"],
                        "attempt": record["attempt"]})
        raise
    finally:
        stop.set()
        thread.join()
        record_path.unlink(missing_ok=True)


def remove_dead_staging(folder: Path) -> None:
    """Remove the staging folders of earlier builds of `folder` whose process has ended (on this host; on another,
    those untouched for twice the time that marks a builder dead), with a warning naming each."""
    quiet_for = 2 * STALE_HEARTBEATS * HEARTBEAT_SECONDS
    for path in folder.parent.glob(f"{folder.name}.staging-*"):
        match = _STAGING.search(path.name[len(folder.name):])
        if match is None or not path.is_dir():
            continue
        alive = _alive_here(match["host"], int(match["pid"]))
        if alive is None:
            with contextlib.suppress(OSError):
                touched = max([path.stat().st_mtime, *(entry.stat().st_mtime for entry in path.iterdir())])
                alive = time.time() - touched < quiet_for
        if alive is False:
            logger.warning("removing %s, left by a preparation (process %s on %s) that ended before it finished",
                           path, match["pid"], match["host"] or socket.gethostname())
            shutil.rmtree(path, ignore_errors=True)


class _Watch:
    """What a waiter knows of the builder of one folder (see the module's docstring): [`check`] raises when the
    current attempt failed or its builder ended without finishing."""

    def __init__(self, folder: Path, what: str, builder: str):
        self.folder, self.what, self.builder = folder, what, builder
        self.record_path, self.failed = building_record(folder), failure_marker(folder)
        earlier = _read(self.failed)
        # a failure there before this wait, by a process that has ended: an earlier attempt's
        self.ignored_failure = earlier if earlier and _record_alive(earlier) is not True else None
        self.seen_at_start = (_read(self.record_path) or {}).get("attempt")
        self.watched, self.beat, self.moved_at, self.current, self.warned = None, None, time.monotonic(), False, set()

    def check(self, now: float) -> None:
        failure = _read(self.failed)
        if failure and (failure != self.ignored_failure or (self.current and failure.get("attempt") == self.watched)):
            raise RuntimeError(f"{self.builder} failed to prepare {self.what} ({self.folder}): {failure.get('error')}")
        if failure and self.ignored_failure and "failure" not in self.warned:
            self.warned.add("failure")
            logger.warning("%s holds the error of an earlier attempt (%s, which has ended): %s; waiting for %s to "
                           "prepare it again", self.failed, _describe(failure), failure.get("error"), self.builder)
        record = _read(self.record_path)
        if record and record.get("attempt") != self.watched:  # a new builder
            self.watched, self.beat, self.moved_at = record.get("attempt"), record.get("beat"), now
            self.current = self.watched != self.seen_at_start
        elif record and record.get("beat") != self.beat:
            self.beat, self.moved_at, self.current = record.get("beat"), now, True
        if not record:
            return
        alive = _record_alive(record)
        self.current = self.current or alive is True
        period = float(record.get("every", HEARTBEAT_SECONDS))
        if alive is False or (alive is None and now - self.moved_at > STALE_HEARTBEATS * period):
            if self.current:
                raise RuntimeError(
                    f"the process preparing {self.what} ({self.folder}), {_describe(record)} (started "
                    f"{record.get('started_at', '?')}), ended without finishing it"
                    + (" (its beat stopped)" if alive is None else "") + ": the run cannot go on; start it again.")
            if self.watched not in self.warned:
                self.warned.add(self.watched)
                logger.warning("%s names %s, which has ended: an earlier attempt; waiting for %s to prepare %s",
                               self.record_path, _describe(record), self.builder, self.what)


def wait_for(folder: Path, what: str, done: Callable[[], bool], poll_seconds: float, report_seconds: float,
             advice: str = "", builders: Callable[[], list[tuple[Path, str]]] | None = None,
             builder: str = "the main process") -> None:
    """
    Wait, looking at the disk every `poll_seconds`, until `done()`; say so every `report_seconds` (with `advice`).
    `builders()`: the folders whose builders to watch and what each makes (by default `folder` itself, making
    `what`), asked again at every look (the shards of a step still to make); `builder` names who makes them.

    Raises:
        `RuntimeError`: the build failed (its error, from `<folder>.failed`), or the process building `folder`
        ended without finishing it (naming its host and process id).
    """
    started = reported = time.monotonic()
    watches = {}
    while not done():
        now = time.monotonic()
        for watched, making in builders() if builders else [(folder, what)]:
            if watched not in watches:
                watches[watched] = _Watch(watched, making, builder)
            watches[watched].check(now)
        if now - reported >= report_seconds:
            reported = now
            logger.warning("still waiting for %s to prepare %s (%.0f min): %s.%s", builder, what,
                           (now - started) / 60, folder, advice)
        time.sleep(poll_seconds)
