"""Hydra launcher plugin of hydra-ddpw."""
