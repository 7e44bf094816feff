"""The built-in probe suites of the five protocols and their sizes, in one place for both
CLIs (``vlm-eval --scale`` and ``vlm-report --scale``).

Each suite is generated from the counterfactual world (:mod:`evaluators.world`), seeded.
Sizes are in the suite's own unit (scenes for DO-Bench -> 10 queries each, pairs for
Causal-HalBench and HalluSegBench, items per task / condition for ReactBench and MIOH).
"small" keeps ``vlm-report``'s ten default arms within minutes on 2 CPU cores; "full" is what an
effect measurement on the organism uses (DO-Bench 400 queries: PriorRobust per series
rests on 40 queries per level); "large" is four times "full", for the cells whose
intervals "full" leaves undecided (MIOH's LC-S / LC-I / HP rest on 12 questions each there,
so one answer moves them 8.3 points; "large" gives 48). It costs four times "full": pick
the tasks it is for with ``--tasks``.
"""

from __future__ import annotations

from typing import Callable

SCALES: dict[str, dict[str, int]] = {
    "small": {"dobench": 12, "mioh": 4, "causal_halbench": 12, "hallusegbench": 10, "reactbench": 5},
    "full": {"dobench": 40, "mioh": 12, "causal_halbench": 40, "hallusegbench": 30, "reactbench": 12},
}
SCALES["large"] = {task: 4 * n for task, n in SCALES["full"].items()}


def _builders() -> dict[str, Callable[[int, int], list]]:
    from .causal_halbench.suite import build as causal
    from .dobench.suite import build as dobench
    from .hallusegbench.suite import build as hsb
    from .mioh.suite import build as mioh
    from .reactbench.suite import build as react

    return {
        "dobench": lambda n, seed: dobench(n_scenes=n, seed=seed),
        "mioh": lambda n, seed: mioh(n_per_condition=n, seed=seed),
        "causal_halbench": lambda n, seed: causal(n_pairs=n, seed=seed),
        "hallusegbench": lambda n, seed: hsb(n_pairs=n, seed=seed),
        "reactbench": lambda n, seed: react(n_per_task=n, seed=seed),
    }


SUITE_NAMES = tuple(SCALES["full"])


def check_tasks(tasks: list[str]) -> None:
    bad = [t for t in tasks if t not in SUITE_NAMES]
    if bad:
        raise ValueError(f"unknown task(s) {bad}; available: {sorted(SUITE_NAMES)}")


def chosen_tasks(tasks: str | None, data: str, default: str, pooled: bool = True) -> list[str]:
    """The built-in suites a command runs, checked: ``--tasks`` as given (``""`` for none);
    without it, ``default`` -- or none when ``--data`` names the user's own files. Our
    choice: a run on one's own data is that data alone unless built-in suites are asked for
    too (``--tasks mioh --data dobench=...``); before, ``--data`` alone also ran the default
    suites, whose queries then entered the same results. Where the command scores both
    sources together (``pooled``: vlm-eval, vlm-report), a benchmark both built in and in
    ``--data`` is refused: its two sets of queries would be scored as one."""
    text = tasks if tasks is not None else ("" if data.strip() else default)
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    check_tasks(chosen)
    given = {item.split("=", 1)[0].strip() for item in data.split(",") if item.strip()}
    if pooled and (both := sorted(set(chosen) & given)):
        raise ValueError(f"{both} in both --tasks and --data: the built-in queries and yours would be scored as one "
                         "benchmark; run them into separate --output_path folders")
    return chosen


def build_suite(task: str, seed: int = 0, scale: str = "full") -> list:
    """The built-in queries of one suite."""
    from hooks.errors import unknown  # here, not at the top: the CLIs read SCALES before torch loads

    if scale not in SCALES:
        raise ValueError(unknown("scale", scale, SCALES))
    check_tasks([task])
    return _builders()[task](SCALES[scale][task], seed)


def build_queries(tasks: list[str], seed: int = 0, scale: str = "full") -> list:
    """The built-in queries of several suites, in the order given."""
    check_tasks(tasks)
    return [q for t in tasks for q in build_suite(t, seed, scale)]
