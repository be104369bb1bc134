"""One Hydra job = one distributed job: what the local and the SLURM launcher share (preparing the
jobs, the task `run_job` calls, the console lines), and a plain run's ranks around Hydra's own run."""
