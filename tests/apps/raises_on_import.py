"""A module whose import fails (named by `platform.upon_finish` in tests of the checks)."""

raise RuntimeError("this module fails as it is imported")
