"""A submodule that its package imported before the stop came."""

VALUE = 42
