"""An app whose run dir is named with `${now:}`: each rank reports the job's `stamp` (the same `${now:}`
as the dir), its output dir, and the time its task ended."""

import json
import os
from datetime import datetime

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddpw_runtime


@hydra.main(version_base=None, config_path="conf", config_name="stamped")
def main(cfg: DictConfig) -> str:
    rank = ddpw_runtime.rank()
    output_dir = HydraConfig.get().runtime.output_dir
    ddpw_runtime.barrier()
    seen = {"rank": rank, "stamp": cfg.stamp, "output_dir": output_dir,
            "ended": datetime.now().strftime("%Y%m%d-%H%M%S.%f")}
    with open(os.path.join(output_dir, f"seen_rank_{rank}.json"), "w") as out:
        json.dump(seen, out)
    return str(cfg.stamp)


if __name__ == "__main__":
    main()
