"""The parts of the benchmark suite: harness, tools, sections, report (see benchmarks/README.md)."""
