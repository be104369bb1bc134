"""Every bound on how long a supervising process waits for a child to end: each stop is a signal, one of these waits,
SIGKILL, then `KILL_WAIT_S`, after which what is still there is named and left behind (docs/faults.md). The grace a
task gets after a signal is the user's (`stop_grace_s`, `interrupt_grace_s`), as is a rank's exit
(`platform.exit_timeout_min`)."""

STARTING_GRACE_S = 1.0
"""What a rank not in its task yet gets after Ctrl-C or SIGTERM: one joining its group waits in torch's C++ code, which
a signal does not end (its peers may be gone)."""
TERM_WAIT_S = 1.0
"""What the processes a job's ranks left running get after SIGTERM: a moment for `multiprocessing`'s resource tracker
to clean /dev/shm."""
REPORT_S = 5.0
"""What a rank 0 in the user's own process gets beyond the others' grace to end its task through Hydra (the user's
callbacks run before it says its task ended)."""
IMPORT_HOLD_S = 2.0
"""How long a stop of a rank 0 in the user's own process waits for an import its task is in to end (within
`REPORT_S`): raised inside it, it leaves modules half made in the process, which runs the task again on a restart."""
CLOSE_WAIT_S = 5.0
"""What the rank starter gets to exit once closed (it kills what it still runs first) before SIGKILL."""
KILL_WAIT_S = 10.0
"""How long any process may take to vanish after SIGKILL before it is named as stuck (in the kernel, as in a hung GPU
call) and left behind."""
ANSWER_WAIT_S = 30.0
"""The longest wait for the rank starter's answer (stopping a job's processes takes `TERM_WAIT_S` + `KILL_WAIT_S`)."""
WAIT_SLICE_S = 1.0
"""The longest single wait of a supervising main thread: Python runs a signal's handler in the main thread, but the
kernel may hand the signal to another thread, which does not end the main thread's wait."""
