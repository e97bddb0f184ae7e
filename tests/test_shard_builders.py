"""The builder of a shard of a prepared step announces itself (`<folder>.shard-<i>-of-<n>.building`, with the
heartbeat of `mgsa_hf.training.builders`): a process waiting for the shards stops with an error naming a builder that
died or the error of one that failed, instead of waiting for ever."""

import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from test_fault_injection import _error_once_the_builder_is_killed, _record_error

from mgsa_hf.training import builders
from mgsa_hf.training.builders import building_record
from mgsa_hf.training.shards import build_shard, shard_announcement, wait_for_shards


def _slow_shard(staging: Path, cut) -> dict:
    staging.mkdir(parents=True)
    time.sleep(600)
    return {}


def _forked_shard_builder(folder: Path, shard: tuple[int, int], build) -> int:
    """A forked process that makes shard `shard` of `folder` with `build`; its pid, once it has announced itself."""
    pid = os.fork()
    if pid == 0:
        try:
            build_shard(folder, shard, build)
        finally:
            os._exit(1)
    deadline = time.monotonic() + 30
    while not building_record(shard_announcement(folder, *shard)).is_file():
        assert time.monotonic() < deadline, "the shard's builder did not start"
        time.sleep(0.05)
    return pid


def _waiter(folder: Path, count: int, errors: list) -> threading.Thread:
    return threading.Thread(target=_record_error, args=(errors, wait_for_shards, folder, count, "the corpus"),
                            kwargs={"poll_seconds": 0.05, "report_seconds": 300})


@pytest.mark.parametrize("seen_from", ["this host", "another host"])
def test_a_killed_shard_builder_ends_the_wait_naming_it(tmp_path, monkeypatch, seen_from):
    """Shard 1 of 2 is made; the process making shard 0 is SIGKILLed. A process waiting for the shards (it waited
    for ever: no shard announced itself) stops with an error naming the shard and its builder's host and process:
    at once on its host, from another host once its beat has stopped for `STALE_HEARTBEATS` periods."""
    monkeypatch.setattr(builders, "HEARTBEAT_SECONDS", 0.2)
    folder = tmp_path / "prepared" / "processed-0123"
    pid = _forked_shard_builder(folder, (0, 2), _slow_shard)
    assert not build_shard(folder, (1, 2), lambda staging, cut: staging.mkdir(parents=True) or {"rows": {},
                                                                                                 "files": {}})
    host = socket.gethostname()
    if seen_from == "another host":
        monkeypatch.setattr(builders.socket, "gethostname", lambda: "another-host")
    errors = []
    error, took = _error_once_the_builder_is_killed(_waiter(folder, 2, errors), errors, pid, alive_for=0.6)
    assert re.search(rf"preparing shard 0 of 2 of the corpus .*process {pid} on {host} .*ended without finishing",
                     str(error)), error
    assert took < (1 if seen_from == "this host" else 0.2 * builders.STALE_HEARTBEATS + 2), took


def test_a_failed_shard_build_ends_the_wait_with_its_error(tmp_path, monkeypatch):
    """A shard's build that raises leaves its error beside the step (`.failed`): the waiter stops with it."""
    monkeypatch.setattr(builders, "HEARTBEAT_SECONDS", 0.2)
    folder = tmp_path / "prepared" / "processed-0123"
    errors = []
    waiting = _waiter(folder, 2, errors)
    waiting.start()
    time.sleep(0.3)

    def broken(staging, cut):
        raise ValueError("the train split holds no rows")

    with pytest.raises(ValueError):
        build_shard(folder, (0, 2), broken)
    waiting.join(timeout=10)
    assert not waiting.is_alive() and [type(error) for error in errors] == [RuntimeError]
    assert "failed to prepare shard 0 of 2 of the corpus" in str(errors[0])
    assert "the train split holds no rows" in str(errors[0])
