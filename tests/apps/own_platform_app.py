"""An app with its own `platform` config group (only `laptop`), that does not use hydra-ddpw."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf_own_platform", config_name="config")
def main(cfg: DictConfig) -> None:
    print(f"cores={cfg.platform.cores}")


if __name__ == "__main__":
    main()
