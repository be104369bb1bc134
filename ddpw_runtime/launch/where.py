"""Ask a running job where each of its ranks is, without stopping it:

    python -m ddpw_runtime.launch.where RUN_DIR

RUN_DIR is a job's output dir, or a folder above it (a sweep's dir): every running job under it answers within a
second. It prints one line per rank (the job's console shows the same); each rank writes every thread's stack to
`stacks_rank_<k>.txt` next to its log. Exit code 0 when a job answered, 1 when none did."""

from __future__ import annotations

import argparse
import pickle
import sys
import time
import uuid
from pathlib import Path

from ddpw_runtime.launch.hangs import CHECK_S, REQUEST, WhereAnswer, WhereRequest, answer_file
from ddpw_runtime.launch.payload import read_pickled, write_atomically


def ask(run_dir: Path, wait_s: float = 10 * CHECK_S) -> dict[Path, list[WhereAnswer]]:
    """Ask every job under `run_dir` where its ranks are; each running job's answers (one per node) within `wait_s`."""
    jobs = sorted({log.parent for log in Path(run_dir).rglob("rank_*.log")})
    if not jobs:  # nothing to ask, nothing to wait for
        return {}
    token = uuid.uuid4().hex
    answers: dict[Path, list[WhereAnswer]] = {}
    try:
        for job in jobs:
            write_atomically(job / REQUEST, pickle.dumps(WhereRequest(token)), 0o644)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            answers = {job: found for job in jobs if (found := _answers(job, token))}
            if answers and all(len(found) == found[0].n_nodes for found in answers.values()):
                break
            time.sleep(CHECK_S / 5)
    finally:  # the wait is over: a job that ended (nobody answers) keeps no request in its folder, nor any answer
        for job in jobs:
            request = read_pickled(job / REQUEST, WhereRequest)
            if request is not None and request.token == token:  # not a later asker's
                (job / REQUEST).unlink(missing_ok=True)
            for path in job.glob(answer_file(job, "*").name):
                answer = read_pickled(path, WhereAnswer)
                if answer is not None and answer.token == token:  # (the report is on the console and in the stacks)
                    path.unlink(missing_ok=True)
    return answers


def _answers(job: Path, token: str) -> list[WhereAnswer]:
    found = (read_pickled(path, WhereAnswer) for path in sorted(job.glob(answer_file(job, "*").name)))
    return [answer for answer in found if answer is not None and answer.token == token]


def main(argv: list[str] | None = None) -> int:
    """The command (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m ddpw_runtime.launch.where", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a job's output dir, or a folder above it")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():  # a typo: not the same as "no job runs there"
        sys.stderr.write(f"{args.run_dir}: no such folder; give a job's output dir, or a folder above it\n")
        return 1
    if not any(args.run_dir.rglob("rank_*.log")):
        sys.stderr.write(f"no job under {args.run_dir} (no rank_<k>.log in it or below): give a job's output dir, or a "
                         "folder above it\n")
        return 1
    answers = ask(args.run_dir)
    if not answers:
        sys.stderr.write(f"no running job answered under {args.run_dir}\n")
        return 1
    for job, found in answers.items():
        print(f"{job}:")
        for answer in found:
            print("\n".join(f"  {line}" for line in answer.report.text().splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
