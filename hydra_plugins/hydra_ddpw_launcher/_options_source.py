"""Where Hydra finds hydra-ddpw's launcher options: a config source (`ddpw://`, appended to every app's search path)
that makes an option's config (`ddpw_conf.store.option_config`) when an app loads it, not when Hydra discovers plugins.

The module's name starts with `_`, so Hydra's plugin scan never executes it again (`config.py` hands its classes to
the scan): Hydra keeps the config source's class in its state, pickled for every rank, and a class re-created by a
second scan would no longer pickle by reference.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin

SCHEME = "ddpw"
PROVIDER = "hydra-ddpw"
LAUNCHER_OPTIONS = tuple(f"ddpw_{device}{twin}" for twin in ("", "_own_platform")
                         for device in ("cpu", "gpu", "mps", "slurm"))
"""The `hydra/launcher` options (their configs: `ddpw_conf.store.OPTIONS`; named here without importing it)."""

TREE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "": (("hydra",), ("ddpw",)),
    "hydra": (("launcher",), ()),
    "hydra/launcher": ((), LAUNCHER_OPTIONS),
}
"""Each group this source holds: its subgroups and its configs (`ddpw`: the empty node of hydra-ddpw 0.1's defaults)."""


def _group_and_name(config_path: str) -> tuple[str, str]:
    group, _, name = config_path.strip("/").removesuffix(".yaml").rpartition("/")
    return group, name


class LauncherOptionsSearchPath(SearchPathPlugin):
    """Appends hydra-ddpw's launcher options to every app's config search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append `ddpw://` (last, where the ConfigStore's configs are too)."""
        search_path.append(provider=PROVIDER, path=f"{SCHEME}://")


class LauncherOptionsSource(ConfigSource):
    """hydra-ddpw's launcher options (`TREE`), each made when loaded."""

    @staticmethod
    def scheme() -> str:
        """`ddpw`."""
        return SCHEME

    def available(self) -> bool:
        """Always."""
        return True

    def is_group(self, config_path: str) -> bool:
        """Whether `config_path` is one of `TREE`'s groups."""
        return config_path.strip("/") in TREE

    def is_config(self, config_path: str) -> bool:
        """Whether `config_path` names one of `TREE`'s configs."""
        group, name = _group_and_name(config_path)
        return group in TREE and name in TREE[group][1]

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        """The subgroups and configs of group `config_path`, as `results_filter` asks."""
        groups, configs = TREE.get(config_path.strip("/"), ((), ()))
        return sorted([*(groups if results_filter in (None, ObjectType.GROUP) else ()),
                       *(configs if results_filter in (None, ObjectType.CONFIG) else ())])

    def load_config(self, config_path: str) -> ConfigResult:
        """The config at `config_path` (package `_global_`), made now."""
        if not self.is_config(config_path):
            raise ConfigLoadError(f"Config not found: {config_path}")
        from ddpw_conf.store import option_config  # made when loaded: plugin discovery stays cheap

        return ConfigResult(config=option_config(_group_and_name(config_path)[1]), path=self.full_path(),
                            provider=self.provider, header={"package": "_global_"})
