"""Options of the Hydra launchers (`hydra.launcher.*`), as structured configs, and their checks."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from ddpw_conf.errors import ConfigError, check_bool, check_int, check_known, check_match, nearest_guess
from ddpw_conf.platform import Device, Platform, check_duration, platform_from_config, resolved_config

_Options = TypeVar("_Options", bound="LauncherOptions")

LOCAL_LAUNCHER = "hydra_plugins.hydra_ddpw_launcher.local_launcher.DdpwLocalLauncher"
SLURM_LAUNCHER = "hydra_plugins.hydra_ddpw_launcher.slurm_launcher.DdpwSlurmLauncher"
PLATFORM_KEY = "platform"
"""Where a job's config holds its Platform, unless the launcher options name another node."""
OWN_PLATFORM = ("_own_platform", "ddpw_platform")
"""The twin of each launcher option for apps with a `platform` of their own: its name's ending, and its platform key."""
NOT_OURS = (". If `platform` is your app's own config node, select the `_own_platform` twin of the launcher "
            "option (such as hydra/launcher=ddpw_cpu_own_platform): hydra-ddpw then reads its platform from "
            "`ddpw_platform` and leaves `platform` to the app")
"""What an error about the `platform` node adds when the node may be the app's own."""
_CONFIG_KEY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass
class LauncherOptions:
    """What every ddpw launcher takes under `hydra.launcher`; the job's resources are in the job config's
    `platform` node, so they can be swept."""

    dry_run: bool = False
    """Print each job's platform and launch plan instead of starting anything."""
    stop_grace_s: float = 1.0
    """Seconds a rank gets to exit after SIGTERM before it is killed, when another rank failed."""
    interrupt_grace_s: float = 10.0
    """Seconds the ranks get after Ctrl-C or SIGTERM (passed on to them) before they are killed."""
    max_restarts: int = 0
    """How many times a failed job is started again (as torchrun's `--max-restarts`; on SLURM: requeued)."""
    platform_key: str = PLATFORM_KEY
    """The job config's node that holds the Platform: `platform`, or `ddpw_platform` with the
    `hydra/launcher=ddpw_*_own_platform` options (apps with a `platform` of their own)."""
    resume: bool = False
    """Go on with the sweep in `hydra.sweep.dir`: its COMPLETED jobs are kept, the others run (docs/sweeps.md)."""
    fail_fast: bool = False
    """The first failed job stops the jobs running beside it, no more start, and the sweep fails."""

    runs_here: ClassVar[bool] = True
    """Whether the ranks run on this machine (so its GPUs are what a platform may ask for)."""

    @classmethod
    def from_mapping(cls: type[_Options], options: Mapping[str, Any]) -> _Options:
        """These options from `hydra.launcher` as Hydra gives them; an unknown key is refused (naming the launchers
        that have it, if any)."""
        from omegaconf import OmegaConf

        if OmegaConf.is_config(options):  # (`hydra.launcher` itself: a value that cannot be resolved is named)
            options = resolved_config(options)
        known = {f.name for f in fields(cls)}
        unknown = next((key for key in options if key not in known), None)
        owner = next((name for kind, name in _KINDS.values() if unknown in {f.name for f in fields(kind)}), None)
        platform_key = options.get("platform_key", PLATFORM_KEY)
        check_known("hydra.launcher.", options, known, "hydra.launcher", "option", f". {unknown} is an option of "
                    f"hydra/launcher={owner} only: select that launcher, or drop it" if owner else
                    f". {unknown} is a field of the job's platform: set {platform_key}.{unknown} instead (under "
                    f"`{platform_key}:` in the config, not `hydra: launcher:`)"
                    if unknown in {f.name for f in fields(Platform)} else "")
        plain: dict[str, Any] = {key: OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
                                 for key, value in options.items()}
        return cls(**plain)

    def validate_platform(self, platform: Platform) -> None:
        """Raise `ConfigError` for a (validated) platform that cannot run with these options."""

    def platform_of(self, config: Any) -> Platform:
        """The Platform of a job's config: its `platform_key` node, which must be there (not the default)."""
        from omegaconf import OmegaConf

        absent = object()
        node = OmegaConf.select(config, self.platform_key, default=absent)
        if node is absent:
            nodes = sorted(str(name) for name in config if name != "hydra")
            raise ConfigError("hydra.launcher.platform_key", self.platform_key, "the job's config has no such node; "
                              f"{nearest_guess(self.platform_key, nodes)}its top-level nodes are "
                              f"{', '.join(nodes) or 'none'}: name the node that holds the platform, or add a "
                              f"`{PLATFORM_KEY}` node (hydra/launcher=ddpw_* brings one)")
        with self.naming_platform_keys():
            platform = platform_from_config(node, NOT_OURS if self.platform_key == PLATFORM_KEY else "")
            _check_launcher_device(config, platform, self.platform_key)
            _check_top_level_fields(config, platform, self.platform_key)
        return platform

    @contextmanager
    def naming_platform_keys(self) -> Iterator[None]:
        """A `ConfigError` about the platform raised in the block names its key as the user types it
        (`ddpw_platform.n_nodes`, when that is the platform's node)."""
        try:
            yield
        except ConfigError as error:
            if self.platform_key == PLATFORM_KEY or error.key.split(".")[0].split("[")[0] != PLATFORM_KEY:
                raise
            raise ConfigError(self.platform_key + error.key[len(PLATFORM_KEY):], error.value, error.fix) from None

    def validate(self, where: str = "hydra.launcher.") -> LauncherOptions:
        """Raise `ConfigError` for an option that cannot run (its key: `where` + its name); returns self."""
        for key in ("dry_run", "resume", "fail_fast"):
            check_bool(f"{where}{key}", getattr(self, key))
        for key in ("interrupt_grace_s", "stop_grace_s"):
            check_duration(f"{where}{key}", getattr(self, key), "use a number of seconds >= 0", "seconds",
                           positive=False)
        check_int(f"{where}max_restarts", self.max_restarts, 0)
        key = self.platform_key
        if not isinstance(key, str) or not _CONFIG_KEY.fullmatch(key) or key.split(".")[0] == "hydra":
            raise ConfigError(f"{where}platform_key", key, "name a node of the job's config, such as platform or "
                              "ddpw_platform (not one under hydra, which cannot be swept)")
        return self


@dataclass
class LocalLauncherConf(LauncherOptions):
    """Options of `hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps`: ranks on this machine."""

    _target_: str = LOCAL_LAUNCHER
    max_parallel_jobs: int | None = None
    """Jobs of a sweep that run side by side, each on devices of its own (null: as many as fit): GPU jobs get
    GPUs, CPU jobs with `platform.n_cpus_per_node` cores; other CPU and MPS jobs take the whole machine."""

    def validate(self, where: str = "hydra.launcher.") -> LocalLauncherConf:
        """Raise `ConfigError` for an option that cannot run; returns self."""
        super().validate()
        check_int("hydra.launcher.max_parallel_jobs", self.max_parallel_jobs, 1, " or null (as many as fit)",
                  optional=True)
        return self

    def validate_platform(self, platform: Platform) -> None:
        """Raise `ConfigError` for a (validated) platform that cannot run: ranks of SLURM's device, or a job across
        machines restarted."""
        platform.validate_not_slurm("hydra/launcher=ddpw_cpu|ddpw_gpu|ddpw_mps")
        if platform.n_nodes > 1 and self.max_restarts:
            raise ConfigError("hydra.launcher.max_restarts", self.max_restarts, "a job across machines "
                              f"(platform.n_nodes={platform.n_nodes}) is not started again yet; use 0")


@functools.cache
def _shell_syntax_error(lines: tuple[str, ...]) -> tuple[str, str] | None:
    """Where and why bash cannot parse `lines` as a script (its line number, from 1, and message), without running
    them (`bash -n`); None if it can, or where there is no bash to ask."""
    if not lines or shutil.which("bash") is None:
        return None
    checked = subprocess.run(["bash", "-n"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    found = re.search(r"line (\d+): (.*)", checked.stderr)
    return (found[1], found[2].strip()) if checked.returncode and found else None


_PLATFORM_ONLY = ("n_gpus_per_node", "n_procs_per_node", "n_cpus_per_node", "mem_per_node", "ipc_groups",
                  "ipc_protocol", "join_timeout_min", "collective_timeout_min", "stall_timeout_min", "stop_on_stall",
                  "exit_timeout_min", "slurm_additional_parameters", "console_logs", "console_ranks", "upon_finish")
"""Platform fields whose names an app's own key does not take by chance (not `n_nodes`, `seed`, `device`...)."""


def _check_top_level_fields(config: Any, platform: Platform, key: str) -> None:
    """Raise `ConfigError` for a platform field at the top level of the job's config (the `platform:` line forgotten)
    whose value is not the platform's (node `key`): it would be ignored, silently. An app's own key of that name that
    agrees with the platform's (`platform.n_gpus_per_node: ${n_gpus_per_node}`) passes."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    absent = object()
    for name in _PLATFORM_ONLY:
        try:
            value = OmegaConf.select(config, name, default=absent)
            used = OmegaConf.select(config, f"{key}.{name}", default=getattr(platform, name))
            value, used = (OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                           for v in (value, used))
        except OmegaConfBaseException:
            continue  # (one that cannot be resolved is not the platform's; the app's own use will say why)
        if value is not absent and value != used:
            here = "not set" if used is None else f"here {used!r}"
            raise ConfigError(name, value, f"a field of the job's platform, read from {key}.{name} ({here}), "
                              f"not from the config's top level: move it under `{key}:` (or {key}.{name}={value} on "
                              f"the command line); if {name} is your app's own key, make the two agree "
                              f"({key}.{name}: ${{{name}}} in the config)")


def _check_launcher_device(config: Any, platform: Platform, key: str) -> None:
    """Raise `ConfigError` where the job's config chose a GPU or MPS launcher option (`hydra/launcher=ddpw_gpu`) but its
    platform (node `key`) says `device: cpu`: set by the app's config over the option's device (a `Platform` in a
    structured config of the app's own brings every field's default), it would run the ranks on CPU, silently."""
    from omegaconf import OmegaConf

    choice = str(OmegaConf.select(config, "hydra.runtime.choices", default={}).get("hydra/launcher"))
    device = choice.removeprefix("ddpw_").removesuffix(OWN_PLATFORM[0])
    if device in ("gpu", "mps") and platform.device_kind is Device.CPU:
        raise ConfigError(f"{key}.device", platform.device, f"hydra/launcher={choice} runs the ranks on "
                          f"{device.upper()}, but the job's platform says device={platform.device}, set in your config "
                          "over the launcher's (a Platform in a structured config of yours sets every field): set "
                          f"{key}.device={device} there or on the command line, or choose "
                          f"hydra/launcher={choice.replace(device, 'cpu', 1)}")


# Values that end up in the sbatch script.
_SLURM_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")  # qos and account names: no spaces, no leading dash
_SLURM_NODES = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,\[\]-]{0,1023}")  # node lists such as `n[1-3],gpu7`
_SLURM_CONSTRAINT = re.compile(r"[A-Za-z0-9_\[(!][A-Za-z0-9_.&|,:*()\[\]!-]{0,1023}")  # features: `a|b`, `[r1|r2]*2`
_ONE_LINE = re.compile(r"[^\n\r\0]*")

SLURM_MANAGED_KEYS: dict[str, str | None] = {
    "job_name": "platform.name", "partition": "platform.partition", "time": "platform.timeout_min",
    "nodes": "platform.n_nodes", "ntasks": None, "ntasks_per_node": None, "cpus_per_task": "platform.n_cpus_per_node",
    "mem": "platform.mem_per_node", "gpus_per_node": "platform.n_gpus_per_node",
    "qos": "hydra.launcher.qos", "account": "hydra.launcher.account",
    "constraint": "hydra.launcher.constraint", "exclude": "hydra.launcher.exclude",
    "output": None, "error": None, "array": None, "signal": None, "open_mode": None,
}
"""sbatch options the launcher sets itself, each with the key that sets it (None: none); refused in
`platform.slurm_additional_parameters`."""


@dataclass
class SlurmLauncherConf(LauncherOptions):
    """Options of `hydra/launcher=ddpw_slurm`: each job runs on SLURM nodes, submitted with submitit."""

    _target_: str = SLURM_LAUNCHER
    interrupt_grace_s: float = 30.0
    """Seconds the ranks get after SIGTERM (requeue, cancel, time limit) before they are killed."""
    fire_and_forget: bool = False
    """Submit, write the manifest (`ddpw_slurm_jobs.json` in the sweep dir) and return at once."""
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    """Where submitit keeps each SLURM job's script, pickles and node logs; `%j` is the job id."""
    qos: str | None = None
    """sbatch `--qos`."""
    account: str | None = None
    """sbatch `--account`."""
    constraint: str | None = None
    """sbatch `--constraint` (node features, such as `a100|h100`)."""
    exclude: str | None = None
    """sbatch `--exclude` (nodes not to use, such as `n[1-3]`)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the batch script before the nodes start (`module load ...`); one line each."""
    array_parallelism: int = 256
    """At most this many jobs of one job array run at once."""
    signal_delay_s: int = 90
    """SLURM warns a job (USR2) this many seconds before its time limit; with `max_restarts` > 0 the ranks then
    get SIGTERM to save a checkpoint, and the job is requeued."""

    runs_here: ClassVar[bool] = False
    """No: the ranks run on SLURM nodes."""

    def validate(self, where: str = "hydra.launcher.") -> SlurmLauncherConf:
        """Raise `ConfigError` for an option that cannot run or would add to the sbatch script; returns self."""
        super().validate()
        check_bool("hydra.launcher.fire_and_forget", self.fire_and_forget)
        for key, pattern, example in (
            ("qos", _SLURM_WORD, "high"),
            ("account", _SLURM_WORD, "my_project"),
            ("constraint", _SLURM_CONSTRAINT, "a100|h100"),
            ("exclude", _SLURM_NODES, "n[1-3],n7"),
        ):
            check_match(f"hydra.launcher.{key}", getattr(self, key), pattern, f"use a single SLURM value such as "
                        f"'{example}' (no spaces, line breaks or leading dash), or null", optional=True)
        if not isinstance(self.setup, (list, tuple)):
            raise ConfigError("hydra.launcher.setup", self.setup,
                              "use a list of shell lines, such as ['module load cuda']")
        for index, line in enumerate(self.setup):
            check_match(f"hydra.launcher.setup[{index}]", line, _ONE_LINE,
                        "each entry is one shell line; put each command in its own entry")
        if (error := _shell_syntax_error(tuple(self.setup))) is not None:
            index = min(int(error[0]), len(self.setup)) - 1  # (past the last line: the end came too soon)
            raise ConfigError(f"hydra.launcher.setup[{index}]", self.setup[index], "bash cannot read the setup lines "
                              f"(line {error[0]}: {error[1]}), so the batch script would fail before the nodes start; "
                              "write each as the shell line it is in the script, quotes, if and loops closed by the "
                              "last line")
        check_int("hydra.launcher.array_parallelism", self.array_parallelism, 1)
        check_int("hydra.launcher.signal_delay_s", self.signal_delay_s, 1)
        if self.max_restarts and self.interrupt_grace_s >= self.signal_delay_s:
            raise ConfigError("hydra.launcher.interrupt_grace_s", self.interrupt_grace_s, "must be below "
                              f"signal_delay_s ({self.signal_delay_s}): the ranks save between SLURM's warning and "
                              "the time limit")
        if "%j" not in str(self.submitit_folder) or any(t in str(self.submitit_folder) for t in ("%A", "%a")):
            raise ConfigError("hydra.launcher.submitit_folder", self.submitit_folder, "use a folder with %j (the job "
                              "id), such as ${hydra.sweep.dir}/.submitit/%j; %A and %a do not work with job arrays")
        return self

    def validate_platform(self, platform: Platform) -> None:
        """Raise `ConfigError` for a (validated) platform that cannot be submitted to SLURM with these options."""
        if platform.device_kind is not Device.SLURM:
            raise ConfigError("platform.device", platform.device, "the ddpw_slurm launcher runs ranks on SLURM nodes: "
                              "use platform.device=slurm (one GPU per rank when n_gpus_per_node > 0, else CPU)")
        for key in platform.slurm_additional_parameters:
            if (name := key.replace("-", "_")) in SLURM_MANAGED_KEYS:
                where = SLURM_MANAGED_KEYS[name]
                raise ConfigError("platform.slurm_additional_parameters", key, f"the launcher sets "
                                  f"--{name.replace('_', '-')} itself" + (f"; use {where}" if where else "; remove it"))
        if self.max_restarts and self.signal_delay_s >= platform.timeout_min * 60:
            raise ConfigError("hydra.launcher.signal_delay_s", self.signal_delay_s, "SLURM's warning would come at "
                              f"once, before any work (platform.timeout_min={platform.timeout_min}), and every run "
                              "would be requeued; use fewer seconds than the time limit has")


_KINDS: dict[str, tuple[type[LauncherOptions], str]] = {
    LOCAL_LAUNCHER: (LocalLauncherConf, "ddpw_cpu|ddpw_gpu|ddpw_mps"),
    SLURM_LAUNCHER: (SlurmLauncherConf, "ddpw_slurm"),
}
"""Each ddpw launcher's options class, and the launcher options (`hydra/launcher=...`) that take it."""


def selected_options(launcher: Mapping[str, Any] | None) -> LauncherOptions | None:
    """The options of the selected launcher (the `hydra.launcher` node) when it is a ddpw launcher, else None."""
    if launcher is None or (kind := _KINDS.get(str(launcher.get("_target_")))) is None:
        return None
    return kind[0].from_mapping(launcher).validate()
