"""A program that starts a thread (a prefetcher, say) before its Hydra run: a plain run with a ddpw launcher goes on in
a fork of the program, which would lack it, so it is refused; a multirun runs."""

import threading

import hydra

import ddpw_runtime


@hydra.main(version_base=None, config_path=None)
def main(cfg: dict) -> int:
    return ddpw_runtime.world_size()


if __name__ == "__main__":
    threading.Thread(target=threading.Event().wait, name="prefetcher", daemon=True).start()
    main()
