"""Every bound on how long a supervising process waits for a child to end, written once: each stop is a signal,
one of these waits, SIGKILL, then `KILL_WAIT_S`, after which what is still there is named on the console and left
behind (docs/faults.md). The grace a task gets after a signal is the user's (`stop_grace_s`, `interrupt_grace_s`)."""

STARTING_GRACE_S = 1.0
"""How long a rank that has not reached its task yet gets to end after Ctrl-C or SIGTERM before it is killed:
one still joining its group waits in torch's C++ code, which a signal does not end (its peers may be gone)."""
TERM_WAIT_S = 1.0
"""How long the processes a job's ranks started (and left running) get after SIGTERM before SIGKILL: a moment,
so that `multiprocessing`'s resource tracker can clean /dev/shm."""
REPORT_S = 5.0
"""What a rank 0 in the user's own process gets beyond the others' grace to end its task through Hydra (the
user's callbacks run before it says its task ended)."""
CLOSE_WAIT_S = 5.0
"""How long the rank starter gets to exit once closed (it kills what it still runs first) before SIGKILL."""
KILL_WAIT_S = 10.0
"""How long any process (a rank, rank 0, a job process, what the ranks started, the rank starter) may take to
vanish after SIGKILL before it is named as stuck (in the kernel, as in a hung GPU call) and left behind."""
AT_EXIT_S = 60.0
"""How long a rank, its result sent, may take to do what Python does as it exits (its `atexit` handlers: a tracker's
upload, say) before it is ended by SIGALRM, its threads' stacks in its log (the job fails, naming it)."""
ANSWER_WAIT_S = 30.0
"""The longest wait for the rank starter's answer (stopping a job's processes takes it `TERM_WAIT_S` +
`KILL_WAIT_S` at most)."""
WAIT_SLICE_S = 1.0
"""The longest single wait of a supervising main thread (for a rank's exit, say): Python runs a signal's
handler (Ctrl-C) in the main thread, but the kernel may hand the signal to another thread of this process,
which does not end the main thread's wait; the handler then runs when the wait ends."""
