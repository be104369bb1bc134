"""The controller of one node's ranks; never imports torch at import time."""
