"""Benchmark protocols, metrics, probe suites and the mechanism report.

Planned (issues 3, 7, 8): HalluSegBench, Causal-HalBench, DO-Bench, ReactBench, MIOH.
Nothing here is implemented yet.
"""
