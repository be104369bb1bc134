"""A platform value or launcher option that the app's config files mark mandatory (`???`) and nothing gives: refused
before anything starts. OmegaConf keeps the value under a `???` it merges, so the launcher option's `platform` and
`hydra.launcher` nodes, composed before the app's configs, fill every such mark with their defaults
(`n_procs_per_node: ???` ran one rank). The marks are read here from the job's config files themselves, in the order
Hydra merged them, without the launcher option's nodes."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from ddpw_conf import ConfigError
from ddpw_conf.platform import keys_where, value_at
from ddpw_runtime import _compat

MISSING = "???"
_FOUND: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
"""For each primary config, platform node, group choices and Hydra overrides: each key the config files leave `???`,
with the last config that marks it (configs do not change while a program runs)."""


def check_given(config: DictConfig, platform_key: str) -> None:
    """Raise `ConfigError` for the first key under `platform_key` or `hydra.launcher` that a config file of the job
    `config` (with its `hydra` node) marks `???`, that no later config file fills and the command line does not
    give."""
    for key, marked_by in _marked(config, platform_key):
        if not _given(config, key):
            raise ConfigError(key, MISSING, f"the value is missing: {marked_by} marks it mandatory (???) and "
                              "nothing gives it (the launcher's default does not count); give one, such as "
                              f"{key}=... on the command line or in the config")


def _marked(config: DictConfig, platform_key: str) -> list[tuple[str, str]]:
    from hydra.core.global_hydra import GlobalHydra

    hydra = config.get("hydra") if isinstance(config, DictConfig) else None
    config_name = OmegaConf.select(config, "hydra.job.config_name", default=None)
    if hydra is None or config_name is None or not GlobalHydra.instance().is_initialized():
        return []  # (a config that Hydra did not compose: there are no config files to read)
    choices = OmegaConf.to_container(hydra.runtime.choices, resolve=False)
    hydra_overrides = OmegaConf.to_container(hydra.overrides.hydra, resolve=False)
    assert isinstance(choices, dict) and isinstance(hydra_overrides, list)
    # The config files merged depend on the primary config, the group choices and Hydra's overrides (its search path)
    key = (config_name, platform_key, tuple(sorted((str(k), str(v)) for k, v in choices.items())),
           tuple(hydra_overrides))
    if (found := _FOUND.get(key)) is None:
        task = OmegaConf.to_container(hydra.overrides.task, resolve=False)
        assert isinstance(task, list)
        found = _FOUND[key] = _read_marks(config_name, [*task, *hydra_overrides], (platform_key, "hydra.launcher"))
    return found


def _read_marks(config_name: str, overrides: list[str], nodes: tuple[str, ...]) -> list[tuple[str, str]]:
    """Merge the `nodes` of the job's own config files (Hydra's and the launcher options' left out) as Hydra merged
    them; the keys left `???`, each with the last config that marks it."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    loader = GlobalHydra.instance().config_loader()
    files: list[tuple[str, Any]] = []
    try:
        for default in loader.compute_defaults_list(config_name, overrides, RunMode.RUN).defaults:
            if default.config_path is None or default.config_path.startswith("hydra/"):
                continue  # (Hydra's own groups, where the launcher options are)
            loaded = _compat.config_file(loader, default.config_path)
            if loaded is None:
                continue
            package = default.package if default.package is not None else loaded.header.get("package") or ""
            placed = OmegaConf.create()
            if package in ("", "_global_"):
                placed = loaded.config
            else:
                OmegaConf.update(placed, package, loaded.config, merge=False)
            shown = default.config_path + (" (a structured config)" if loaded.path.startswith("structured:")
                                           else ".yaml")
            files.append((shown, OmegaConf.to_container(placed, resolve=False)))
        found = []
        for node in nodes:
            merged = OmegaConf.create()
            for _, data in files:
                if (value := value_at(data, node)) is not None:
                    merged.merge_with({"node": value})
            for key in keys_where(value_at(OmegaConf.to_container(merged, resolve=False), "node"),
                                  lambda value: value == MISSING, node):
                found.append((key, next(shown for shown, data in reversed(files)
                                        if value_at(data, key) == MISSING)))
    except (HydraException, OmegaConfBaseException):  # (Hydra composed these same files; here, nothing to add)
        return []
    return found


def _given(config: DictConfig, key: str) -> bool:
    """Whether an override of the job's command line (or sweep) sets `key`, or a node above it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = OmegaConf.select(config, "hydra.runtime.choices", default={})
    typed = [str(line) for node in (config.hydra.overrides.task, config.hydra.overrides.hydra)
             for line in OmegaConf.to_container(node, resolve=False)]  # type: ignore[union-attr]
    for override in OverridesParser.create().parse_overrides(typed):
        name = override.key_or_group
        if override.is_delete() or name in choices:  # (a config group's choice was merged as a config file)
            continue
        if key == name or key.startswith((f"{name}.", f"{name}[")):
            return True
    return False
