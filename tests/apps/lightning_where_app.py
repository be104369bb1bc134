"""A Lightning fit, then, once every rank's fit has returned, rank 0 asks where each rank is (`python -m
ddpw_runtime.launch.where`, as a user does from another shell) while rank 1 waits for it in a barrier; the answer goes
to `where.txt` in the job's output dir."""

import subprocess
import sys
from pathlib import Path

import hydra
import lightning as L
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@hydra.main(version_base=None, config_path=None)
def main(cfg: DictConfig) -> int:
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    samples = torch.utils.data.TensorDataset(torch.randn(8, 2))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(samples, batch_size=4))
    dist.barrier()  # every rank's fit has returned
    if dist.get_rank() == 0:
        output_dir = HydraConfig.get().runtime.output_dir
        answer = subprocess.run([sys.executable, "-m", "ddpw_runtime.launch.where", output_dir],
                                capture_output=True, text=True, timeout=60)
        (Path(output_dir) / "where.txt").write_text(answer.stdout + answer.stderr)
    dist.barrier()
    return trainer.world_size


if __name__ == "__main__":
    main()
