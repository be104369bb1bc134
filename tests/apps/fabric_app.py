"""A Lightning Fabric training script as Fabric repos write it (its Fabric made from the config), with
no line for hydra-ddpw; each rank reports the world Fabric trained in and how many steps it took."""

import json
import os

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="fabric")
def main(cfg: DictConfig) -> int:
    fabric = hydra.utils.instantiate(cfg.fabric)
    fabric.launch()
    model = torch.nn.Linear(4, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    if cfg.setup == "together":
        model, optimiser = fabric.setup(model, optimiser)
    else:
        model = fabric.setup_module(model)
        optimiser = fabric.setup_optimizers(optimiser)
    steps = 0
    for _ in range(cfg.steps):
        optimiser.zero_grad()
        fabric.backward(model(torch.randn(8, 4)).pow(2).mean())
        optimiser.step()
        steps += 1
    seen = {"rank": fabric.global_rank, "world_size": fabric.world_size, "steps": steps}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, f"seen_rank_{fabric.global_rank}.json"), "w") as out:
        json.dump(seen, out)
    return steps


if __name__ == "__main__":
    main()
