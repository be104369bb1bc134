import os, sys, time, functools, importlib
T0 = time.time()
_fd = os.open("/tmp/marks.txt", os.O_WRONLY|os.O_APPEND|os.O_CREAT|os.O_TRUNC)
def mark(what):
    os.write(_fd, f"{(time.time()-T0)*1000:7.1f} ms pid {os.getpid()} {what}\n".encode())
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    owner = mod; parts = qual.split(".")
    for p in parts[:-1]: owner = getattr(owner, p)
    f = getattr(owner, parts[-1])
    @functools.wraps(f)
    def w(*a, **k):
        mark(f"> {qual}")
        try: return f(*a, **k)
        finally: mark(f"< {qual}")
    setattr(owner, parts[-1], w)
import torch, rank_work
mark("torch imported")
from ddpw_runtime import Platform, Wrapper
mark("ddpw_runtime imported")
import ddpw_runtime.launch.engine, ddpw_runtime.launch.supervisor, ddpw_runtime.launch.starter_process, ddpw_runtime.rank.entry, ddpw_runtime.rank.setup
mark("engine etc imported")
for m, q in [("ddpw_runtime.launch.starter", "RankStarter._launch"), ("ddpw_runtime.launch.starter_process", "_Server.__init__"),
             ("ddpw_runtime.rank.setup", "warm_up"), ("ddpw_runtime.launch.starter_process", "_Server._start"),
             ("ddpw_runtime.rank.entry", "run_rank"), ("ddpw_runtime.rank.setup", "setup_rank"), ("ddpw_runtime.rank.setup", "teardown_rank"),
             ("rank_work", "run"), ("ddpw_runtime.launch.engine", "LocalJob.__init__"), ("ddpw_runtime.launch.supervisor", "Supervisor.start"),
             ("ddpw_runtime.launch.supervisor", "Supervisor.wait"), ("ddpw_runtime.launch.starter", "close_starters"), ("ddpw_runtime.launch.engine", "LocalJob.close"),
             ("ddpw_runtime.launch.engine", "LocalJob.host_store"),
  ("ddpw_runtime.launch.payload", "RankPayload.read"), ("ddpw_runtime.rank.entry", "_redirect_output"), ("ddpw_runtime.rank.entry", "tell_imported_libraries"),
  ("ddpw_runtime.rank.entry", "configure_logging"), ("ddpw_runtime.rank.setup", "_store"), ("torch.distributed", "init_process_group"),
  ("ddpw_runtime.rank.setup", "_all_joined"), ("ddpw_runtime.rank.setup", "answer_task_init"), ("ddpw_runtime.rank.setup", "_seed"),
  ("ddpw_runtime.rank.entry", "_torch_modules_imported"), ("ddpw_runtime.rank.entry", "write_atomically"), ("ddpw_runtime.rank.entry", "flush_output"),
  ("torch.distributed", "destroy_process_group"), ("ddpw_runtime.rank.setup", "_layout_mesh"), ("ddpw_runtime.rank.entry", "rank_environment"),
  ("ddpw_runtime.launch.supervisor", "supervise"), ("ddpw_runtime.launch.payload", "write_private"), ("ddpw_runtime.rank.setup", "context.enter")]:
    try: wrap(m, q)
    except Exception as e: mark(f"cannot wrap {q}: {e}")
import atexit
atexit.register(lambda: mark("atexit last"))
mark("start")
Wrapper(Platform(n_procs_per_node=2)).start(rank_work.run, "trivial")
mark("returned")
