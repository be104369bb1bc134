"""How one job finds its nodes across machines without SLURM (docs/multi-node.md): the platform's environment or
explicit fields (`environment.py`), the nodes' controllers talking through the job's store (`channel.py`), and
each node's controller (`controller.py`)."""
