"""Image-blind audit of a probe suite: how much of it can be answered from the text alone?

    python -m evaluators.benchmarks.blind_audit --tasks reactbench,mioh --scale large
    python -m evaluators.benchmarks.blind_audit --fit-seed 10 --seed 11 --min-lift 10
    python -m evaluators.benchmarks.blind_audit --tasks "" --data dobench=my.jsonl --mask sofa,lamp

A probe that a rule reading only the question (and its options) answers better than a
constant answer measures that rule as much as the model's perception: a mitigation that
merely shifts the model towards the rule then reads as a fix. Sessions 31-34 found such
leaks in our own suites one at a time, each with a rule written for it (the only option
whose verb differs, the commoner object, a verb that tells the answer, the image with the
most objects). This audit runs the generic text-only rules on any suite, so that a new
suite, a suite change or a user's own query list can be checked before it is trusted.

Rules are *fitted* on the queries of ``fit_seed`` and *scored* on those of ``seed`` (other
scenes, the same construction), so a rule that only memorises items scores nothing. Within
each group of queries that share a benchmark, an answer kind and the record fields a prompt
shows by design (:data:`GROUP_FIELDS`: the task, question type, inducing dimension, hint and
prior level), it compares:

* ``constant``: the group's commonest answer (the baseline: a group whose answer is always
  "no" by its paper's design is not a leak of the text);
* ``template``: the commonest answer per prompt with its object, colour and number words
  masked (what the wording alone says: a verb, a belief's polarity, an option list);
* ``prompt``: the commonest answer per exact prompt (the object's name with the wording),
  falling back to ``template`` and then ``constant`` for prompts the fit seed never asked;
* ``option`` (multiple choice only): the option whose text was right most often in the fit
  set (Laplace-smoothed), ties broken by the constant letter;
* ``option_template``: the same with each option's object, colour and number words masked
  (a kind of option that is right more often: "the _ was removed");
* ``odd_one_out``: the one option whose masked text no other option shares, where there is
  exactly one (the constant letter otherwise): the option that stands out.

A group's *lift* is the best rule's held-out accuracy minus the constant's, in points. Only
the kinds whose truth is one token are audited (``yes_no``, ``option``, ``number``,
``choice``); masks, keywords and free text are skipped.

Seeing no lift does not prove a suite clean. On the suites as they were before session 31's
fixes it flags Causal-HalBench's object word (+27.8 points at ``--scale large``) and dense
counting's never-right intervals (+18.7), but session 34's leaks (a pair of change kinds of
which one was always right, the other object drawn unlike the changed one) lift these
generic rules by 8 points at most: a rule written for the structure finds what a generic
one misses. Rules on the image's simple statistics (its background colour, its object
count) are beyond a text audit. The sessions' own audits stay in ``tests/test_suites.py``.
Groups of 12 items (ReactBench at ``--scale full``) give chance lifts up to +25 points:
audit at ``--scale large``. Any two lists of :class:`~evaluators.query.Query` built the same
way from different scenes can be audited with :func:`audit`.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

AUDITED_KINDS = ("yes_no", "option", "number", "choice")
#: Record fields a prompt shows by its template: a rule may know them. Fields that follow
#: from the answer (DO-Bench's series, MIOH's condition or presence, Causal-HalBench's
#: question type) are not among them.
GROUP_FIELDS = ("task", "qtype", "dimension", "hint", "level", "n_images", "mode")
RULES = ("constant", "template", "prompt", "option", "option_template", "odd_one_out")


#: Leaks the papers' own protocols make, which a faithful suite keeps: (benchmark, the group
#: fields that identify the group, why). The audit marks these groups instead of flagging them;
#: read their cells beside the unmitigated baseline and the yes-ratio, as the report does.
PAPER_MADE: tuple[tuple[str, dict, str], ...] = (
    ("dobench", {"level": (1, 2, 3)},
     "DO-Bench Sec. 3.2: every belief sentence contradicts the truth (A-series beliefs deny a "
     "present object, B-series ones assert an absent one), so answering against it is right"),
    ("mioh", {"qtype": ("comprehensive",), "n_images": (4,)},
     "MIOH Sec. 4.3: the LC-S / LC-I pressure sentences always contradict the images"),
    ("reactbench", {"task": ("relational_erasure",), "dimension": ("absurd",)},
     "ReactBench Table 4's absurd contrast: 'neither' beside the erased object and an absurd "
     "alternative is always right"),
    ("reactbench", {"task": ("counterfactual_attribute",), "dimension": ("absurd",)},
     "ReactBench Table 4's absurd contrast: the usual colour and 'every colour at once' are "
     "never right (the object was recoloured)"),
)


@dataclass(frozen=True)
class GroupAudit:
    """One group's held-out accuracies (%) per rule, and the lift of the best over ``constant``."""
    benchmark: str
    kind: str
    group: tuple
    n_fit: int
    n_test: int
    accuracy: dict

    @property
    def lift(self) -> float:
        return max(v for v in self.accuracy.values()) - self.accuracy["constant"]

    @property
    def best_rule(self) -> str:
        return max(self.accuracy, key=lambda r: (self.accuracy[r], -RULES.index(r)))

    @property
    def fields(self) -> dict:
        return dict(zip(GROUP_FIELDS, self.group))

    def paper_made(self) -> str | None:
        """Why this group's lift is its paper's design (:data:`PAPER_MADE`), or None."""
        return next((why for bench, match, why in PAPER_MADE if bench == self.benchmark
                     and all(self.fields.get(f) in allowed for f, allowed in match.items())), None)


def _masked_words() -> frozenset[str]:
    from ..organism.tasks import NUMBERS
    from ..world import CATEGORIES, COLOURS

    return frozenset({*CATEGORIES, *COLOURS, *NUMBERS})


def template(prompt: str, masked: frozenset[str] | None = None) -> str:
    """``prompt`` with its object, colour and number words replaced by ``_``."""
    masked = _masked_words() if masked is None else masked
    return " ".join("_" if w in masked else w for w in re.findall(r"[\w']+|[^\w\s]", prompt.lower()))


def group_of(query) -> tuple:
    return (query.benchmark, query.kind, *(query.record.get(f) for f in GROUP_FIELDS))


def _truth(query):
    return str(query.truth).strip().lower()


def _commonest(counter: Counter):
    """The commonest value, ties broken by the value's text (so the audit is deterministic)."""
    top = max(counter.values())
    return min(v for v, c in counter.items() if c == top)


def split_units(queries: list) -> tuple[list, list]:
    """``queries`` in two halves, whole samples (a scene group, an image pair) alternating
    between them in file order: for a query list that has no second seed (your data)."""
    from ..query import unit_of

    order: dict[str, int] = {}
    for q in queries:
        order.setdefault(unit_of(q), len(order))
    halves = ([], [])
    for q in queries:
        halves[order[unit_of(q)] % 2].append(q)
    return halves


def audit(fit: list, test: list, mask: tuple[str, ...] = ()) -> list[GroupAudit]:
    """Per group of ``test`` queries (see the module docstring), the held-out accuracy of each
    text-only rule fitted on ``fit``. Groups the fit set lacks are skipped. The templates mask
    the world's object, colour and number words and ``mask`` (your data's object names)."""
    masked = _masked_words() | {w.lower() for w in mask}
    keep = lambda qs: [q for q in qs if q.kind in AUDITED_KINDS and q.truth is not None and not q.problem]
    fit, test = keep(fit), keep(test)
    by_group: dict[tuple, list] = defaultdict(list)
    for q in fit:
        by_group[group_of(q)].append(q)
    tested: dict[tuple, list] = defaultdict(list)
    for q in test:
        tested[group_of(q)].append(q)
    out = []
    for key in sorted(tested, key=repr):
        fitted = by_group.get(key)
        if not fitted:
            continue
        constant = _commonest(Counter(_truth(q) for q in fitted))
        per_template: dict[str, Counter] = defaultdict(Counter)
        per_prompt: dict[str, Counter] = defaultdict(Counter)
        right, shown = Counter(), Counter()  # per option text, and per masked option text
        for q in fitted:
            per_template[template(q.prompt, masked)][_truth(q)] += 1
            per_prompt[q.prompt][_truth(q)] += 1
            if q.kind == "option" and q.options:
                for letter, text in zip(_letters(len(q.options)), q.options):
                    for k in (("text", text), ("template", template(text, masked))):
                        shown[k] += 1
                        right[k] += letter == _truth(q)
        hits = Counter()
        for q in tested[key]:
            truth, tmpl = _truth(q), template(q.prompt, masked)
            by_tmpl = _commonest(per_template[tmpl]) if tmpl in per_template else constant
            guesses = {"constant": constant, "template": by_tmpl,
                       "prompt": _commonest(per_prompt[q.prompt]) if q.prompt in per_prompt else by_tmpl}
            if q.kind == "option" and q.options:
                letters = _letters(len(q.options))
                masks = [template(t, masked) for t in q.options]
                for rule, keys in (("option", [("text", t) for t in q.options]),
                                   ("option_template", [("template", m) for m in masks])):
                    rates = [(right[k] + 1) / (shown[k] + 2) for k in keys]
                    tied = [letter for letter, r in zip(letters, rates) if r == max(rates)]
                    guesses[rule] = constant if constant in tied else tied[0]
                alone = [letter for letter, m in zip(letters, masks) if masks.count(m) == 1]
                guesses["odd_one_out"] = alone[0] if len(alone) == 1 else constant
            for rule, guess in guesses.items():
                hits[rule] += guess == truth
        n = len(tested[key])
        accuracy = {rule: 100.0 * hits[rule] / n for rule in RULES if rule in hits}
        out.append(GroupAudit(key[0], key[1], key[2:], len(fitted), n, accuracy))
    return out


def _letters(n: int) -> list[str]:
    from ..organism.tasks import OPTION_LETTERS

    if n > len(OPTION_LETTERS):
        raise ValueError(f"options: at most {len(OPTION_LETTERS)} are lettered, got {n}")
    return list(OPTION_LETTERS[:n])


def format_table(rows: list[GroupAudit]) -> str:
    """Markdown, largest lift first; a paper-made lift says so (its reasons listed below)."""
    head = "| benchmark | kind | group (" + ", ".join(GROUP_FIELDS) + ") | test items | " + " | ".join(RULES) + " | lift |"
    lines = [head, "|" + "---|" * (5 + len(RULES))]
    reasons: list[str] = []
    for r in sorted(rows, key=lambda r: (-r.lift, r.benchmark, repr(r.group))):
        group = ", ".join(str(v) for v in r.group if v is not None) or "-"
        cells = " | ".join(f"{r.accuracy[k]:.1f}" if k in r.accuracy else "" for k in RULES)
        why = r.paper_made() if r.lift > 0 else None
        if why and why not in reasons:
            reasons.append(why)
        note = f" paper-made [{reasons.index(why) + 1}]" if why else ""
        lines.append(f"| {r.benchmark} | {r.kind} | {group} | {r.n_test} | {cells} | {r.lift:+.1f} ({r.best_rule}){note} |")
    lines += [""] + [f"[{i}] {why}" for i, why in enumerate(reasons, 1)] if reasons else []
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .suites import SCALES, SUITE_NAMES, build_suite, check_tasks

    parser = argparse.ArgumentParser(prog="python -m evaluators.benchmarks.blind_audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(SUITE_NAMES), help="comma-separated built-in suites")
    parser.add_argument("--scale", default="large", choices=sorted(SCALES),
                        help="large by default: groups of 12 items (full) give chance lifts up to +25 points")
    parser.add_argument("--fit-seed", type=int, default=10, help="the suite seed the rules are fitted on")
    parser.add_argument("--seed", type=int, default=11, help="the suite seed they are scored on")
    parser.add_argument("--data", default="",
                        help="your data, benchmark=path[,benchmark=path] in native formats (as vlm-eval reads it): "
                             "fitted on every other sample, scored on the rest; --tasks '' skips the built-in suites")
    parser.add_argument("--mask", default="", help="comma-separated words the templates mask too (your object names)")
    parser.add_argument("--min-lift", type=float, default=0.0, help="show groups whose lift is at least this")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    try:
        check_tasks(tasks)
        from ..cli import parse_kv
        from .protocols import load_data

        data = {bench: load_data({bench: path}) for bench, path in parse_kv(args.data).items()}
    except ValueError as err:
        parser.error(str(err))
    if args.fit_seed == args.seed:
        parser.error("--fit-seed and --seed must differ: a rule scored on the scenes it was fitted on memorises them")
    mask = tuple(w.strip() for w in args.mask.split(",") if w.strip())
    rows = []
    for task in tasks:
        rows += audit(build_suite(task, args.fit_seed, args.scale), build_suite(task, args.seed, args.scale), mask)
    for queries in data.values():
        rows += audit(*split_units(queries), mask)
    print(format_table([r for r in rows if r.lift >= args.min_lift]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
