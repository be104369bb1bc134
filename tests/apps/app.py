"""A Hydra app for the tests: every rank reports what it sees; one rank can be told to misbehave."""

import atexit
import contextlib
import ctypes
import gzip
import io
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "GROUP_RANK")


def report(cfg: DictConfig) -> dict:
    """What this rank sees, written to `seen_rank_<k>.json` in the job's output dir."""
    rank = ddpw_runtime.rank()
    group = ddpw_runtime.group()
    members = torch.tensor([float(rank)], device=ddpw_runtime.device())  # (NCCL takes tensors on the rank's GPU)
    dist.all_reduce(members, group=group)
    world = torch.tensor([1.0], device=ddpw_runtime.device())
    dist.all_reduce(world)
    seen = {
        "rank": rank,
        "world_size": ddpw_runtime.world_size(),
        "local_rank": ddpw_runtime.local_rank(),
        "device": str(ddpw_runtime.device()),
        "group_rank_sum": members.item(),
        "all_reduce_world": world.item(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "output_dir": HydraConfig.get().runtime.output_dir,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "threads": torch.get_num_threads(),
        "cfg_behaviour": cfg.behaviour,
        "restart_count": ddpw_runtime.restart_count(),
        "run_id": ddpw_runtime.run_id(),
    }
    path = os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{rank}.json")
    with open(path, "w") as out:
        json.dump(seen, out)
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"attempts_rank_{rank}.jsonl"), "a") as out:
        out.write(json.dumps({"restart_count": seen["restart_count"], "run_id": seen["run_id"]}) + "\n")
    return seen


def save_on_sigterm(rank: int, output_dir: str, takes_s: float = 0.0) -> None:
    """On SIGTERM, save (write a file, after `takes_s`: a large checkpoint's save) and exit, as a real task would: set
    before the rank says it started."""

    def save_and_exit(signum: int, frame: object) -> None:
        time.sleep(takes_s)
        with open(os.path.join(output_dir, f"saved_rank_{rank}.txt"), "w") as out:
            out.write("saved")
        print(f"rank {rank} saved its checkpoint", flush=True)
        sys.exit(143)

    signal.signal(signal.SIGTERM, save_and_exit)


class Stopped(Exception):
    """SIGTERM, raised in the task by its handler (`count_stops`)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped()


def count_stops(rank: int, output_dir: str) -> None:
    """Wait for Ctrl-C (KeyboardInterrupt) or SIGTERM (`Stopped`), then save for 1 s, as a checkpoint's save on a stop
    takes its time, and exit; `stops_rank_<k>.txt` lists the stop and every one that came again during the save."""
    signal.signal(signal.SIGTERM, _raise_stopped)
    came = []
    open(os.path.join(output_dir, f"waiting_rank_{rank}"), "w").close()
    try:
        wait_for_ever()
    except (KeyboardInterrupt, Stopped) as first:
        came.append(type(first).__name__)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            while time.monotonic() < end:
                sum(range(1000))
        except (KeyboardInterrupt, Stopped) as again:
            came.append(type(again).__name__)
    with open(os.path.join(output_dir, f"stops_rank_{rank}.txt"), "w") as out:
        out.write(" ".join(came))
    sys.exit(0)


def wait_for_signals() -> None:
    """Wait until a signal comes (SIGTERM: see `save_on_sigterm`)."""
    while True:
        signal.pause()


def start_children(output_dir: str, rank: int) -> None:
    """Start two long sleeps, one in this rank's session and one in a session of its own, and write their
    pids to `children_rank_<k>.json`."""
    own = subprocess.Popen(["sleep", "1000"])
    detached = subprocess.Popen(["sleep", "1001"], start_new_session=True)
    path = os.path.join(output_dir, f"children_rank_{rank}.json")
    with open(path + ".tmp", "w") as out:
        json.dump([own.pid, detached.pid], out)
    os.replace(path + ".tmp", path)  # whole, for whoever reads it while the rank runs


class Point:
    """A class of the app's script (`__main__`), which a spawned rank knows only by value."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __repr__(self) -> str:
        return f"Point({self.x})"


class RefusesPickling:
    """A value whose `__reduce__` raises."""

    def __reduce__(self) -> tuple:
        raise TypeError("this value refuses pickling")

    def __repr__(self) -> str:
        return "RefusesPickling()"


class Unprintable(Exception):
    """An exception whose message cannot be read: its `__str__` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ refuses")


LEFT_OPEN: list = []
"""The files a `leave_open` task leaves open, held as a module's global holds a metrics writer."""


class ClosesConnectionsOnClose(io.RawIOBase):
    """A file the task leaves open, whose close as the rank ends (after its result is written) ends what the rank
    sends on its TCP connections, so its peers fail on them, then waits for the job's stop (SIGTERM ends it)."""

    def close(self) -> None:
        for fd in map(int, os.listdir("/proc/self/fd")):
            with contextlib.suppress(OSError):
                sock = socket.socket(fileno=fd)
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_WR)
                sock.detach()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            signal.pause()


def leave_open(output_dir: str, rank: int) -> None:
    """Write to files the task leaves open (a text file, a gzip file: its end is written only as it is closed), and
    register an exit handler: as the rank ends, what the files hold back is written and the handler runs."""
    LEFT_OPEN.append(open(os.path.join(output_dir, f"open_rank_{rank}.txt"), "w"))
    LEFT_OPEN.append(gzip.open(os.path.join(output_dir, f"open_rank_{rank}.gz"), "wt"))
    for file in LEFT_OPEN:
        file.write("kept\n")
    atexit.register(lambda: open(os.path.join(output_dir, f"atexit_rank_{rank}.txt"), "w").write("ran\n"))


def say_at_exit(rank: int) -> None:
    """What a task leaves to say as its process ends: an exit handler's print, a line written to fd 2 directly (a C
    library), a logger of its own flushed as logging shuts down, and (made last: run first) a `weakref.finalize`."""
    import logging
    import weakref

    atexit.register(lambda: print(f"rank {rank}: an exit handler's print", flush=True))
    atexit.register(lambda: os.write(2, f"rank {rank}: written to fd 2 at exit\n".encode()))
    logger = logging.getLogger("says_at_exit")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(sys.stdout))
    atexit.register(lambda: logger.warning("rank %d: a record logged at exit", rank))
    LEFT_OPEN.append(kept := type("Kept", (), {})())
    weakref.finalize(kept, print, f"rank {rank}: a finalizer's print", flush=True)


def upload_at_exit() -> None:
    """An exit handler that hangs (a tracker's upload whose server does not answer)."""
    while True:
        time.sleep(1)


def misbehave(behaviour: str) -> object:
    if behaviour == "hang":
        while True:
            time.sleep(1)
    if behaviour == "flood":
        chunk = "x" * 1023 + "\n"
        for _ in range(50 * 1024):
            sys.stdout.write(chunk)
        raise RuntimeError("failed after a flood of output")
    if behaviour == "raise":
        raise ValueError("rank asked to fail")
    if behaviour == "peer_gone":  # what gloo raises in a rank whose connection to another node was lost
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.2]:29500")
    if behaviour == "raise_then_close":  # its peers fail as it ends, which it does only once the job is stopped
        LEFT_OPEN.append(ClosesConnectionsOnClose())
        raise ValueError("rank asked to fail")
    if behaviour == "exit":
        os._exit(3)
    if behaviour == "exit_0":  # status 0, with no result sent: the other ranks return (no collective) and wait for it
        os._exit(0)
    if behaviour == "sysexit":
        sys.exit(4)
    if behaviour == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "abort_after_saying":  # what C++ code says as it aborts, then the abort
        print("shard 17 is corrupted", flush=True)
        os.abort()
    if behaviour == "segfault":  # with threads of its own, as a DataLoader's and a tracker's, listed before it
        for _ in range(3):
            threading.Thread(target=threading.Event().wait, daemon=True).start()
        ctypes.string_at(0)
    if behaviour == "unpicklable":
        return threading.Lock()
    if behaviour == "main_class_value":
        return Point(ddpw_runtime.rank())
    if behaviour == "refuses_pickling":
        return RefusesPickling()
    if behaviour == "printf":  # C-level output left in the C library's buffer, then a return
        ctypes.CDLL(None).printf(b"printf without a newline")
    if behaviour == "printf_raise":  # C-level output left in the C library's buffer, then a raise
        ctypes.CDLL(None).printf(b"last words from C")
        raise ValueError("raised after a printf")
    if behaviour == "unprintable":
        raise Unprintable("never shown")
    if behaviour == "partial_exit":  # a partial line of Python output, then an exit that flushes nothing
        sys.stdout.write("partial line before os._exit")
        os._exit(5)
    if behaviour == "closed_streams":
        sys.stdout.close()
        sys.stderr.close()
        raise ValueError("raised after closing stdout and stderr")
    if behaviour == "spawn_lock_kill":  # a semaphore in /dev/shm (spawn context), then death by SIGKILL
        multiprocessing.get_context("spawn").Lock()
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "worker_raise":  # torch re-raises it with the worker's traceback in its message, many lines
        return sum(int(batch.sum()) for batch in torch.utils.data.DataLoader(FailsAtThree(), num_workers=1))
    if behaviour == "local_exception":

        class DefinedInTheTask(Exception):
            pass

        raise DefinedInTheTask("an exception class defined inside the task")
    if behaviour == "fail_first_attempt" and ddpw_runtime.restart_count() == 0:
        raise ValueError("the first attempt fails")
    if behaviour == "raise_then_exit":  # the first attempt raises; a later one ends with no traceback
        if ddpw_runtime.restart_count() == 0:
            raise ValueError("the first attempt fails")
        os._exit(3)
    return None


def load_until_a_peer_fails(failing: int) -> None:
    """Rank `failing` raises once every other rank iterates a DataLoader with two workers (as a training loop
    does, over an epoch longer than the job lasts); those iterate until they are stopped."""
    if ddpw_runtime.rank() == failing:
        dist.barrier()
        raise ValueError("rank asked to fail while its peers load data")
    data = torch.utils.data.TensorDataset(torch.arange(1 << 24))
    for step, _ in enumerate(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)):
        if step == 0:
            dist.barrier()


def load_for_ever(output_dir: str, rank: int) -> None:
    """Iterate a DataLoader with two workers for ever, as a training loop does; `loading_rank_<k>` once they run."""
    data = torch.utils.data.TensorDataset(torch.arange(1 << 24))
    for step, _ in enumerate(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)):
        if step == 0:
            open(os.path.join(output_dir, f"loading_rank_{rank}"), "w").close()
        time.sleep(0.01)


def load_batch() -> None:
    """A data loader that never returns (stuck on a file system, or on a worker that died)."""
    while True:
        time.sleep(1)


class FailsAtThree(torch.utils.data.Dataset):
    """A dataset whose item 3 raises in the DataLoader worker that loads it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 3:
            raise ValueError("item 3 cannot be read")
        return torch.tensor(index)


class SlowToLetGo:
    """What a task's frame holds and takes a second to let go of (a DataLoader whose workers are joined as its
    iterator goes): a rank whose collective timed out ends that much later."""

    def __del__(self) -> None:
        time.sleep(1)


def hold_up(holder: int, slow_end: bool = False, stopped: bool = False) -> None:
    """Rank `holder` is stuck loading a batch (with `stopped`, stopped by SIGSTOP) while the other ranks wait for it in
    all_reduce (with `slow_end`, those but rank 0 hold a `SlowToLetGo`: rank 0's failure stops the job while they
    end)."""
    if ddpw_runtime.rank() == holder:
        if stopped:
            os.kill(os.getpid(), signal.SIGSTOP)
        load_batch()
    held = SlowToLetGo() if slow_end and ddpw_runtime.rank() != 0 else None  # noqa: F841 - let go with this frame
    dist.all_reduce(torch.ones(1, device=ddpw_runtime.device()))


NCCL_TIMEOUT = ("[rank0]:[E1127 07:56:49.541237512 ProcessGroupNCCL.cpp:688] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=6000) "
                "ran for 6003 milliseconds before timing out.")
"""The line NCCL's watchdog logs for a collective that timed out (torch 2.11, seen on a GPU)."""


def aborted_as_by_nccl(holder: int) -> None:
    """Rank `holder` is stuck loading a batch; each other rank waits for it in all_reduce until a thread of its own
    does what NCCL's watchdog does when a collective times out (a stand-in: NCCL needs a GPU): it logs the timeout
    and aborts the process (SIGABRT, with faulthandler's crash report in the rank's log), no result sent."""
    main = threading.main_thread().ident
    assert main is not None

    def watchdog() -> None:
        while not any("/torch/distributed/" in frame.filename
                      for frame in traceback.extract_stack(sys._current_frames()[main])):
            time.sleep(0.01)  # until the main thread waits in the collective
        print(NCCL_TIMEOUT, file=sys.stderr, flush=True)
        os.abort()

    if ddpw_runtime.rank() != holder:
        threading.Thread(target=watchdog, name="watchdog", daemon=True).start()
    hold_up(holder)


def train_held_up(holder: int) -> None:
    """DDP training: rank `holder` is stuck loading its third batch while the other ranks wait for it in
    `backward()`, where DDP all-reduces the gradients (no frame of torch.distributed on their Python stacks)."""
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    for step in range(4):
        if step == 2 and ddpw_runtime.rank() == holder:  # (DDP's first steps also synchronise in forward)
            load_batch()
        model(torch.ones(2, 4)).sum().backward()


def ignore(sig: int) -> None:
    """Ignore `sig`, as a task that handles its own signals may (then `wait_for_ever`)."""
    signal.signal(sig, signal.SIG_IGN)


def wait_for_ever() -> None:
    """Wait for ever, deaf to the signals the task ignores."""
    while True:
        time.sleep(1)


def all_reduce_until_a_peer_goes(ignored: int) -> None:
    """All-reduce until a peer is gone; this rank ignores Ctrl-C (`ignored` == its rank), so a Ctrl-C
    reaches it only as the error of a collective whose peer ended: a training step in flight."""
    if ddpw_runtime.rank() == ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        dist.all_reduce(torch.ones(1))


def linger() -> None:
    """Leave a non-daemon thread running (until a file `release` appears in the working dir)."""

    def wait_for_release() -> None:
        while not os.path.exists("release"):
            time.sleep(0.05)

    threading.Thread(target=wait_for_release, name="lingering-writer").start()


def fork_a_sleeper(output_dir: str, rank: int) -> None:
    """Fork a process that runs no exec and sleeps (as a DataLoader worker or a vectorised environment is), and
    write its pid to `forked_rank_<k>.json`."""
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(1)
    path = os.path.join(output_dir, f"forked_rank_{rank}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(pid, out)
    os.replace(path + ".tmp", path)


def start_in_background(output_dir: str, rank: int) -> None:
    """Start three short commands in the background through a shell, which ends at once (`sleep 0.1 &`: each is
    left to whoever adopts orphans), and write their pids to `background_rank_<k>.json`."""
    pids = [int(subprocess.run("sleep 0.1 & echo $!", shell=True, capture_output=True, text=True).stdout)
            for _ in range(3)]
    path = os.path.join(output_dir, f"background_rank_{rank}.json")
    with open(path + ".tmp", "w") as out:
        json.dump(pids, out)
    os.replace(path + ".tmp", path)


def report_forked_handlers(output_dir: str) -> None:
    """Fork a process (as DataLoader workers and vectorised environments are) that writes which signal
    handlers it has, and what Ctrl-C raises in it."""

    def child() -> None:
        handlers = {name: repr(signal.getsignal(getattr(signal, name))) for name in ("SIGINT", "SIGTERM", "SIGUSR2")}
        handlers["SIGRTMIN+3"] = repr(signal.getsignal(signal.SIGRTMIN + 3))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            raised = "nothing"
        except BaseException as exc:  # what a Ctrl-C raises here
            raised = f"{type(exc).__module__}.{type(exc).__qualname__}"
        with open(os.path.join(output_dir, "fork_handlers.json"), "w") as out:
            json.dump({"handlers": handlers, "raised": raised}, out)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join()


def freeze(freezer: str) -> None:
    """Freeze this process (cgroup v1 freezer): a process stuck as in a hung driver call, which not even
    SIGKILL ends until the cgroup is thawed."""
    os.makedirs(freezer, exist_ok=True)
    with open(os.path.join(freezer, "tasks"), "w") as out:
        out.write(str(os.getpid()))
    with open(os.path.join(freezer, "freezer.state"), "w") as out:
        out.write("FROZEN")
    while True:
        time.sleep(1)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> object:
    if cfg.behaviour in ("wait", "children_wait", "fork_wait", "background_wait", "wait_fail_first_attempt"):  # (a
        # test may send SIGTERM once it has the report)
        save_on_sigterm(ddpw_runtime.rank(), HydraConfig.get().runtime.output_dir)
    if cfg.behaviour in ("ignore_sigint", "ignore_sigterm"):  # (before the report too: a test signals once it has it)
        ignore(signal.SIGINT if cfg.behaviour == "ignore_sigint" else signal.SIGTERM)
    seen = report(cfg)
    print(f"hello from rank {seen['rank']}", flush=True)
    os.write(1, f"raw fd write from rank {seen['rank']}\n".encode())
    if cfg.behaviour in ("children", "children_wait"):
        start_children(seen["output_dir"], seen["rank"])
    if cfg.behaviour == "loader":  # DataLoader workers, the way training loops use them
        data = torch.utils.data.TensorDataset(torch.arange(64))
        assert sum(len(b[0]) for b in torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)) == 64
    if cfg.behaviour == "wait_fail_first_attempt" and ddpw_runtime.restart_count() == 0:  # rank 1 fails while the
        dist.barrier()  # others wait to be stopped, their checkpoint on SIGTERM set
        if seen["rank"] == cfg.fail_rank:
            raise ValueError("the first attempt fails")
        wait_for_signals()
    if cfg.behaviour == "stopped_in_an_import":  # (see stopped_in_import/__init__.py)
        if seen["rank"] == cfg.fail_rank and ddpw_runtime.restart_count() == 0:
            dist.barrier()
            raise ValueError("the first attempt fails")
        if seen["rank"] == 0:
            import stopped_in_import

            if ddpw_runtime.restart_count() == 0:
                wait_for_signals()
            assert stopped_in_import.part.VALUE == 42  # (the submodule the package imported on the first attempt)
    if cfg.behaviour in ("wait", "children_wait"):
        wait_for_signals()
    if cfg.behaviour == "count_stops":
        count_stops(seen["rank"], seen["output_dir"])
    if cfg.behaviour in ("ignore_sigint", "ignore_sigterm"):
        wait_for_ever()
    if cfg.behaviour == "gil":  # a C call that never returns, the GIL held throughout (a hung extension)
        libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
        mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t: a default mutex
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # locked again by its owner: it waits for ever, deaf to signals
    if cfg.behaviour == "linger":
        linger()
    if cfg.behaviour == "load_then_fail":
        load_until_a_peer_fails(cfg.fail_rank)
    if cfg.behaviour in ("hold_up", "hold_up_slow_end", "hold_up_stopped"):
        hold_up(cfg.fail_rank, slow_end=cfg.behaviour == "hold_up_slow_end", stopped=cfg.behaviour == "hold_up_stopped")
    if cfg.behaviour == "aborted_as_by_nccl":
        aborted_as_by_nccl(cfg.fail_rank)
    if cfg.behaviour == "train_held_up":
        train_held_up(cfg.fail_rank)
    if cfg.behaviour == "all_reduce_until_a_peer_goes":
        all_reduce_until_a_peer_goes(cfg.fail_rank)
    if cfg.behaviour == "fork_report" and seen["rank"] == 0:
        report_forked_handlers(seen["output_dir"])
    if cfg.behaviour == "freeze" and seen["rank"] == cfg.fail_rank:
        freeze(cfg.freezer)
    if cfg.behaviour == "loader_wait":  # a DataLoader's workers, and a save on SIGTERM that takes its time
        save_on_sigterm(seen["rank"], seen["output_dir"], takes_s=0.5)
        load_for_ever(seen["output_dir"], seen["rank"])
    if cfg.behaviour == "fork_wait":  # a fork without exec (a worker, an environment), then wait for a signal
        fork_a_sleeper(seen["output_dir"], seen["rank"])
        save_on_sigterm(seen["rank"], seen["output_dir"])
        wait_for_signals()
    if cfg.behaviour == "background_wait":  # commands started in the background (`cmd &`) that end, then a wait
        start_in_background(seen["output_dir"], seen["rank"])
        wait_for_signals()
    if cfg.behaviour == "own_sigusr1_hang":  # the task's own SIGUSR1 handler (a checkpoint on signal), then a hang
        mark = os.path.join(seen["output_dir"], f"sigusr1_rank_{seen['rank']}")
        signal.signal(signal.SIGUSR1, lambda *_: open(mark, "w").close())
        if seen["rank"] == cfg.fail_rank:
            misbehave("hang")
    if cfg.behaviour == "ended_early" and seen["rank"] == cfg.fail_rank:  # it returns; the others enter a barrier
        return {"rank": seen["rank"]}
    if cfg.behaviour == "says_at_exit":
        say_at_exit(seen["rank"])
    if cfg.behaviour == "exited_early" and seen["rank"] == cfg.fail_rank:  # sys.exit(0); the others enter a barrier
        sys.exit(0)
    if cfg.behaviour == "mp_temp_dir":  # multiprocessing's temporary folder, which it removes as the process ends
        multiprocessing.util.get_temp_dir()
    if cfg.behaviour == "leave_open":
        leave_open(seen["output_dir"], seen["rank"])
    if cfg.behaviour == "leave_open_then_raise" and seen["rank"] == cfg.fail_rank:  # and a slow exit handler
        leave_open(seen["output_dir"], seen["rank"])
        atexit.register(time.sleep, 60)  # (last registered: runs first)
        raise ValueError("failed with files left open")
    if cfg.behaviour == "hang_at_exit" and seen["rank"] == cfg.fail_rank:
        atexit.register(upload_at_exit)
    if cfg.behaviour == "sysexit_0_everywhere":  # every rank ends its task with sys.exit(0), as a script that is done
        sys.exit(0)
    odd = None
    if ddpw_runtime.rank() == cfg.fail_rank and cfg.behaviour != "ok":
        odd = misbehave(cfg.behaviour)
    if cfg.behaviour != "exit_0":
        dist.barrier()
    return odd if odd is not None else {"rank": seen["rank"], "world_size": seen["world_size"]}


if __name__ == "__main__":
    main()
