"""The controller of one node's ranks: plan, rendezvous, rank starter, supervisor, outcome.

Never imports torch at import time; a rank that runs in the controller's own process (`caller_rank`)
imports it when it starts.
"""
