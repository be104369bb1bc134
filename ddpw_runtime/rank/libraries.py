"""The Lightning and Fabric callbacks (entry points in `pyproject.toml`) that stop a `Trainer` or `Fabric` left at
fewer devices than the launched ranks, each of which would train alone (docs/architecture.md), and give a rank back its
stacks on request after a `Trainer` ends."""

from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from typing import Any

from ddpw_runtime.launch.payload import JOB_ENV

_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")


def in_rank() -> bool:
    """Whether this process is a rank of a hydra-ddpw job (or was started by one, with its variables)."""
    return JOB_ENV in os.environ and "TORCHELASTIC_RUN_ID" in os.environ and "WORLD_SIZE" in os.environ


def lightning_callbacks(package: str = "lightning.pytorch") -> list[Any]:
    """Entry point `lightning.pytorch.callbacks_factory`: the check, in a hydra-ddpw rank."""
    return [trainer_check(package)] if in_rank() else []


def pytorch_lightning_callbacks() -> list[Any]:
    """Entry point `pytorch_lightning.callbacks_factory`: the same check for the `pytorch_lightning` package."""
    return lightning_callbacks("pytorch_lightning")


def fabric_callbacks() -> list[Any]:
    """Entry points `lightning.fabric.callbacks_factory` and `lightning_fabric.callbacks_factory`: the check."""
    return [FabricCheck()] if in_rank() else []


def trainer_check(package: str) -> Any:
    """A new check (that package's `Callback`) for the Trainers of `package`; it pickles as a call of this function,
    so it travels where the Trainer goes (`strategy="ddp_spawn"`)."""
    return _trainer_check_class(package)()


@functools.cache
def _trainer_check_class(package: str) -> type:
    """The class of `trainer_check(package)`, made once, when Lightning asks for its callbacks."""

    class TrainerCheck(importlib.import_module(package).Callback):  # type: ignore[misc]
        """Stops a Trainer that would fit outside the launched world (validating, say, runs, as under torchrun)."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """Lightning's hook at the start of every stage (`fit`, `validate`, `test`, `predict`)."""
            if stage == "fit":
                check("Trainer", int(trainer.world_size), int(trainer.num_devices), int(trainer.num_nodes))

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            """Lightning's hook at the end of every stage, after the Trainer set every signal's handler back to
            Python's: the rank writes its stacks when asked again (`recorder.restore_stacks`)."""
            from ddpw_runtime.rank import recorder

            recorder.restore_stacks()

        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return trainer_check, (package,)

    return TrainerCheck


class FabricCheck:
    """Stops a Fabric that trains outside the launched world, once, at its first optimizer step (the only hook that
    tells training from inference, which is never stopped)."""

    def __init__(self) -> None:
        self.checked = False

    def on_after_optimizer_step(self, strategy: Any, optimizer: Any) -> None:
        """Every optimizer step of an optimizer Fabric set up."""
        if not self.checked:
            devices = int(getattr(strategy, "num_processes", 1))
            check("Fabric", int(getattr(strategy, "world_size", 1)), devices, int(getattr(strategy, "num_nodes", 1)))
            self.checked = True


class LibraryWorldMismatch(ValueError):
    """A training library would not train in the world hydra-ddpw launched."""


def check(library: str, world_size: int, devices: int, num_nodes: int) -> None:
    """`LibraryWorldMismatch` when `library` (`Trainer` or `Fabric`), about to train with `world_size` processes
    (`devices` on each of `num_nodes`), is not in the launched world."""
    launched = (int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["GROUP_WORLD_SIZE"]))
    if world_size != launched[0]:  # the job's config is read for the message only
        raise LibraryWorldMismatch(mismatch(library, world_size, devices, num_nodes, launched, config_key(library)))


def mismatch(library: str, world_size: int, devices: int, num_nodes: int, world: tuple[int, int, int],
             key: str | None) -> str | None:
    """What is wrong with `library` at `world_size` in the launched `world` (world size, ranks per node, nodes), and
    the fix; None when they agree. `key`: the job config's node with the library's arguments, if known."""
    launched_size, per_node, nodes = world
    if world_size == launched_size:
        return None
    fix = f"use {library}(devices={per_node}, num_nodes={nodes})"
    if key is not None:
        typed = [f"{key}.devices={per_node}"] + ([f"{key}.num_nodes={nodes}"] if num_nodes != nodes else [])
        fix += f" (here: {' '.join(typed)})"
    if library == "Trainer":
        fix += ", or leave devices and num_nodes unset (they follow the platform)"
    return (f"{library}(devices={devices}, num_nodes={num_nodes}) would run {world_size} process(es) in a job of "
            f"{launched_size} rank(s), so every rank would train alone: {fix}")


def config_key(library: str) -> str | None:
    """The key of the node of the job's `.hydra/config.yaml` that makes `library`'s object (by `_target_`); None
    outside a Hydra job, without that file, or without such a node."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized() or HydraConfig.get().output_subdir is None:
        return None
    hydra = HydraConfig.get()
    saved = Path(str(hydra.runtime.output_dir)) / str(hydra.output_subdir) / "config.yaml"
    try:
        config = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    except (OSError, ValueError):
        return None
    return _node_making(config, library)


def _node_making(node: Any, library: str, prefix: str = "") -> str | None:
    if not isinstance(node, dict):
        return None
    target = node.get("_target_")
    if isinstance(target, str) and target.split(".")[0] in _PACKAGES and target.rsplit(".", 1)[-1] == library:
        return prefix or None
    for name, value in node.items():
        found = _node_making(value, library, f"{prefix}.{name}" if prefix else str(name))
        if found is not None:
            return found
    return None
