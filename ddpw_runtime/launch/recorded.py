"""What each rank's flight recorder (torch's record of the collectives it entered, per process group, with their
sequence numbers) held: read from the `fr_rank_<k>` dumps next to the rank logs, written when a rank's stacks are taken
or its collective timed out. Data only (no torch): a dump is read as plain data, never as objects it could name."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpw_runtime.launch.plan import recorder_file

_DEFAULT_GROUP_DESC = "default_pg"  # how torch describes the default process group
_UNDESCRIBED = ("", "undefined")  # how torch describes a group made without `group_desc`: named by its name


@dataclass(frozen=True)
class Collective:
    """One collective a rank entered: `name` (`all_reduce`), its sequence number `seq` in its process group
    (`group`: torch's name for it; `desc`: its description, `default_pg` for the default group)."""

    name: str
    seq: int
    group: str
    desc: str = _DEFAULT_GROUP_DESC

    def __str__(self) -> str:
        described = self.group if self.desc in _UNDESCRIBED else self.desc
        where = "" if self.desc == _DEFAULT_GROUP_DESC else f" of group {described}"
        return f"{self.name} #{self.seq}{where}"


@dataclass(frozen=True)
class Recorded:
    """What rank `rank`'s flight recorder held (point-to-point operations left out): the last collective it entered in
    each process group, the newest last, and every one it held, oldest first."""

    rank: int
    last: tuple[Collective, ...] = ()
    entered: tuple[Collective, ...] = ()

    @property
    def newest(self) -> Collective | None:
        """The last collective the rank entered (None: none recorded)."""
        return self.last[-1] if self.last else None

    def in_group(self, group: str) -> Collective | None:
        """The last collective the rank entered in process group `group`."""
        return next((collective for collective in self.last if collective.group == group), None)


class _PlainData(pickle.Unpickler):
    """Reads a pickle of plain data only (dicts, lists, strings, numbers): a dump names no class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump names {module}.{name}")


def recorded_in(log_dir: Path, ranks: Iterable[int]) -> tuple[Recorded, ...]:
    """What the flight recorders of `ranks` held, from their readable dumps in `log_dir`."""
    found = (read(rank, recorder_file(log_dir, rank)) for rank in sorted(ranks))
    return tuple(recorded for recorded in found if recorded is not None)


def read(rank: int, path: Path) -> Recorded | None:
    """What rank `rank`'s flight recorder held, from torch's pickled dump at `path` (`entries`, each with its
    `process_group` (name, desc), `collective_seq_id`, `profiling_name` `gloo:all_reduce`); None if unreadable."""
    try:
        with open(path, "rb") as src:
            dump = _PlainData(src).load()
        entries = [entry for entry in dump.get("entries", []) if not entry.get("is_p2p")]
        entered: list[tuple[int, Collective]] = []
        for entry in entries:
            group, desc = (str(part) for part in entry["process_group"])
            name = str(entry["profiling_name"]).rpartition(":")[2]
            entered.append((int(entry["record_id"]), Collective(name, int(entry["collective_seq_id"]), group, desc)))
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, KeyError, TypeError, ValueError):
        return None
    entered.sort(key=lambda item: item[0])
    last = {collective.group: (record_id, collective) for record_id, collective in entered}
    return Recorded(rank, tuple(collective for _, collective in sorted(last.values(), key=lambda item: item[0])),
                    tuple(collective for _, collective in entered))
