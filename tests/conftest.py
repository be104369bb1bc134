"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import local_cluster, skip_reason

# The tests send Ctrl-C to the programs they start, and to this process, as from a terminal: a test run that
# was itself started ignoring SIGINT (a script's background command) would pass that on to every program.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


_TEST_MARK = "DDPW_TEST"
"""The variable that marks, in their environment, the processes a test started (and theirs)."""


@pytest.fixture(autouse=True)
def _processes_a_test_started_end_with_it(request: pytest.FixtureRequest,
                                          monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test, SIGKILL what it started that still runs: a test that failed before it ended its programs
    would leave them running, loading the machine for the tests after it. (Tests that check that nothing of a job is
    left do so themselves, before this.)"""
    value = f"{os.getpid()}:{request.node.nodeid}"
    monkeypatch.setenv(_TEST_MARK, value)
    mark = f"\0{_TEST_MARK}={value}\0".encode()
    yield
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry.name}/environ", "rb") as environ:
                    if mark in b"\0" + environ.read() and not _this_processs_rank_starter(int(entry.name)):
                        os.kill(int(entry.name), signal.SIGKILL)


def _this_processs_rank_starter(pid: int) -> bool:
    """Whether `pid` is the rank starter of this test process (a Wrapper called here keeps it for the next call, as
    in a notebook; a fresh interpreter, as with a CUDA build of torch, has the mark of the test that started it)."""
    from ddpw_runtime.launch import starter

    return any(handle.pid == pid for handle in starter._starters.values())


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private two-node SLURM cluster (nodes n1, n2; partitions debug and cpu2) for the whole test
    session, its client variables (SLURM_CONF) set in this process's environment, so every SLURM
    client and every app the tests start talks to it. Skips, with how to enable it, where no cluster
    can be started."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with local_cluster(tmp_path_factory.mktemp("slurm")) as env:
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need the local SLURM cluster (the `slurm_env` fixture) are marked `cluster`, so a run can
    leave them out (`-m "not cluster"`: one cluster per CI run)."""
    for item in items:
        if "slurm_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.xdist_group("slurm"))  # one worker runs them all (pytest -n): one cluster
