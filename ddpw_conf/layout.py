"""`Layout`: how the ranks of a job split into data-, tensor- and pipeline-parallel groups, and its checks (each rank
builds the groups with torch's `DeviceMesh`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpw_conf.errors import ConfigError, check_int, check_known

AXES = ("pipeline", "data", "tensor")
"""The mesh axes, outermost first: tensor-parallel groups are runs of consecutive ranks (same node)."""


@dataclass
class Layout:
    """Sizes of the parallel axes; their product is the world size. `data` unset (null) takes whatever `tensor` and
    `pipeline` leave (the default: every rank data-parallel)."""

    data: int | None = None
    tensor: int = 1
    pipeline: int = 1

    @property
    def is_data_only(self) -> bool:
        """Whether every rank is a data-parallel replica (no tensor or pipeline split)."""
        return self.tensor == 1 and self.pipeline == 1

    def sizes(self, world_size: int) -> dict[str, int]:
        """The size of each axis in `AXES` order, `data` resolved for a world of `world_size` ranks."""
        data = self.data if self.data is not None else world_size // (self.tensor * self.pipeline)
        return {"pipeline": self.pipeline, "data": data, "tensor": self.tensor}

    def validate(self, world_size: int) -> None:
        """Raise `ConfigError` unless the sizes are positive integers whose product is `world_size`."""
        for axis in ("tensor", "pipeline", "data"):
            check_int(f"platform.layout.{axis}", getattr(self, axis), 1, optional=axis == "data")
        split = self.tensor * self.pipeline
        if world_size % split:
            axis = "tensor" if self.tensor >= self.pipeline else "pipeline"  # blame the larger
            raise ConfigError(f"platform.layout.{axis}", getattr(self, axis), f"tensor ({self.tensor}) x pipeline "
                              f"({self.pipeline}) = {split} must divide the world size {world_size}; choose sizes "
                              f"whose product divides {world_size}, or change the number of ranks")
        if self.data is not None and self.data * split != world_size:
            raise ConfigError("platform.layout.data", self.data, f"data x tensor x pipeline = {self.data} x "
                              f"{self.tensor} x {self.pipeline} = {self.data * split}, but the world has {world_size} "
                              f"rank(s); set data to {world_size // split}, or leave it unset (null) to use every rank "
                              "tensor and pipeline leave")


def layout_from_config(node: Any) -> Layout:
    """A `Layout` from a mapping (or None for the default); unknown keys raise ConfigError."""
    if node is None:
        return Layout()
    if not isinstance(node, dict):
        raise ConfigError("platform.layout", node, "use a mapping such as {tensor: 2}")
    check_known("platform.layout.", node, AXES, "Layout")
    return Layout(**node)
