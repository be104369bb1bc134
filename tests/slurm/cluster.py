"""Start and stop the private Slurm test cluster of ``cluster.sh`` from Python.

Typical use, from a session-scoped pytest fixture::

    @pytest.fixture(scope="session")
    def slurm_env(tmp_path_factory):
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
        with local_cluster(tmp_path_factory.mktemp("slurm")) as env:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # SLURM_CONF, for submitit's sbatch/sacct/...
            try:
                yield env
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

Every Slurm client (sbatch, squeue, sacct, scancel, i.e. everything submitit runs)
must see ``SLURM_CONF`` from ``env``: without it a client searches DNS for the
controller, which these tests must never do.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"

# Executables the cluster needs, all from the Debian packages `cluster.sh install` adds.
_DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db")
_CLIENTS = ("sbatch", "squeue", "sacct", "sacctmgr", "scancel", "sinfo", "mariadb")
_TOOLS = ("unshare", "mount", "setsid", "timeout", "python3")

# Whole start (the script's own limit is 60 s) plus margin; stop takes 1-3 s.
_START_TIMEOUT_S = 90
_STOP_TIMEOUT_S = 90


def skip_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the SLURM test cluster needs root (it bind-mounts a private /etc/hosts)"
    missing = [
        name
        for name in _DAEMONS + _CLIENTS
        if not (os.access(f"/usr/sbin/{name}", os.X_OK) or shutil.which(name))
    ]
    if missing:
        return (
            f"SLURM packages missing ({', '.join(missing)}): "
            "run `bash tests/slurm/cluster.sh install` as root to enable the SLURM tests"
        )
    tools = [name for name in _TOOLS if not shutil.which(name)]
    if tools:
        return f"tools needed by tests/slurm/cluster.sh missing: {', '.join(tools)}"
    # A root without CAP_SYS_ADMIN (some containers) cannot make the private namespace.
    probe = subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True, text=True, timeout=10, check=False
    )
    if probe.returncode != 0:
        return f"`unshare --mount` fails here: {probe.stderr.strip()}"
    return None


def _parse_env_sh(path: Path) -> dict[str, str]:
    """Parse the ``export NAME=VALUE`` lines that cluster.sh writes."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            env[name] = value
    return env


def _run(action: str, root: Path, timeout: float) -> None:
    proc = subprocess.run(
        ["bash", str(CLUSTER_SH), action, str(root)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"cluster.sh {action} {root} failed (exit {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )


@contextmanager
def local_cluster(root: Path) -> Iterator[dict[str, str]]:
    """Run a private Slurm cluster (nodes n1, n2; partitions debug, cpu2) under ``root``.

    Yields the environment variables a client needs (``SLURM_CONF``). The cluster is
    stopped on exit, also when starting it failed half-way.
    """
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        _run("start", root, _START_TIMEOUT_S)
        yield _parse_env_sh(root / "env.sh")
    finally:
        _run("stop", root, _STOP_TIMEOUT_S)
