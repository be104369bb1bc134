"""Options of the Hydra launchers (`hydra.launcher.*`), as structured configs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LocalLauncherConf:
    """Options of `hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps`: ranks on this machine.

    The job's resources are not here but in the job config's `platform` node, so they can be swept.
    """

    _target_: str = "hydra_plugins.hydra_ddpw_launcher.local_launcher.LocalLauncher"
    launch_in_run_mode: bool = True
    """Start the ranks in a plain run (no `-m`) too; needs `- ddpw` in the primary config's defaults."""
    dry_run: bool = False
    """Print each job's platform and launch plan instead of starting anything."""
    stop_grace_s: float = 1.0
    """Seconds a rank gets to exit after SIGTERM before it is killed, when the job stops early."""
