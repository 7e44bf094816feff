"""Image-blind audit of a probe suite: how much of it can be answered from the text alone?

    python -m evaluators.benchmarks.blind_audit                      # every suite, --scale large
    python -m evaluators.benchmarks.blind_audit --tasks reactbench --seeds 10,11,20,21 --min-lift 10
    python -m evaluators.benchmarks.blind_audit --data dobench=my.jsonl --mask sofa,lamp

A probe that a rule reading only the question (and its options) answers better than a
constant answer measures that rule as much as the model's perception: a mitigation that
merely shifts the model towards the rule then reads as a fix. This runs generic text-only
rules on any suite, so that a suite change or your own query list can be checked before it
is trusted.

Rules are *fitted* on queries built from one seed and *scored* on queries built from
another (other scenes, the same construction), both ways round, and the accuracies are
pooled over every ordered pair of ``--seeds``; a rule that memorises items scores nothing.
Your data (``--data``) is split into two halves of whole samples by a hash of each sample
(its unit field, else its image files) and audited both ways. Within each group of queries
that share a benchmark, an answer kind, the number of options and the record fields a prompt
shows by design (:data:`GROUP_FIELDS`), it compares:

* ``constant``: the group's commonest answer (the baseline: a group whose answer is always
  "no" by its paper's design is not a leak of the text, but the table marks a group whose
  constant is right 90% of the time or more);
* ``template``: the commonest answer per prompt with its object, colour and number words
  masked (what the wording alone says: a verb, a belief's polarity);
* ``prompt``: the commonest answer per exact prompt (the object's name with the wording),
  falling back to ``template`` and then ``constant`` for prompts the fit half never asked;
* ``option`` (multiple choice): the option whose text was right most often in the fit half
  (Laplace-smoothed), ties broken by the constant letter; ``option_template``: the same with
  each option's words masked (a kind of option that is right more often); ``odd_one_out``:
  the one option whose masked text no other option shares, where there is exactly one.

A group's *lift* is the best rule's held-out accuracy minus the constant's, in points. Only
the kinds whose truth is one token are audited (``yes_no``, ``option``, ``number``,
``choice``); masks, keywords and free text are skipped. The papers' own leaks are data
(:data:`PAPER_MADE`), each with the rule and the lift its design gives: a group that exceeds
that lift is flagged like any other. A text audit is coarse: rules written for a suite's
structure, and rules on the image's simple statistics (background colour, object count),
find what these miss (``tests/test_suites.py`` keeps those), and docs/suites.md says what this
audit found and missed on earlier versions of the suites.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from ..answers import OPTION_LETTERS

AUDITED_KINDS = ("yes_no", "option", "number", "choice")
#: Record fields a prompt shows by its template, so a rule may know them. Fields that follow
#: from the answer (DO-Bench's series, MIOH's condition or presence, Causal-HalBench's
#: question type) are not among them.
GROUP_FIELDS = ("task", "qtype", "dimension", "hint", "level", "n_images", "mode")
RULES = ("constant", "template", "prompt", "option", "option_template", "odd_one_out")
ONE_ANSWER = 90.0  # a constant right this often is marked: the group has (nearly) one answer


@dataclass(frozen=True)
class PaperMade:
    """A leak a paper's own protocol makes and a faithful suite keeps: the groups it covers,
    the rules that exploit it, the largest lift (points) it explains, and why."""
    benchmark: str
    kind: str
    match: dict
    rules: tuple[str, ...]
    max_lift: float
    why: str


PAPER_MADE: tuple[PaperMade, ...] = (
    PaperMade("dobench", "yes_no", {"level": (1, 2, 3)}, ("template", "prompt"), 50.0,
              "DO-Bench Sec. 3.2: every belief sentence contradicts the truth (A-series beliefs deny a "
              "present object, B-series ones assert an absent one), so answering against it is right"),
    PaperMade("mioh", "yes_no", {"qtype": ("comprehensive",)}, ("template", "prompt"), 20.0,
              "MIOH Sec. 4.3: the LC-S / LC-I pressure sentences always contradict the images"),
    PaperMade("reactbench", "option", {"task": ("counterfactual_attribute",), "dimension": ("direct",)},
              ("option", "option_template"), 15.0,
              "ReactBench Sec. 3.1's counterfactual attribute: the object's usual colour, one of the four "
              "options, is never right (the object was recoloured), so avoiding it gives 1/3 against 1/4"),
    PaperMade("reactbench", "option", {"task": ("relational_erasure",), "dimension": ("direct",)},
              ("option", "option_template"), 15.0,
              "ReactBench Sec. 3.1's relational erasure: the erased companion is always an option and never "
              "right (it was removed), so avoiding it gives 1/3 against 1/4 (our world erases fork or tree)"),
    PaperMade("reactbench", "option", {"task": ("relational_erasure",), "dimension": ("absurd",)},
              ("template", "prompt", "option", "option_template"), 100.0,
              "ReactBench Table 4's absurd contrast: 'neither' beside the erased object and an absurd "
              "alternative is always right"),
    PaperMade("reactbench", "option", {"task": ("counterfactual_attribute",), "dimension": ("absurd",)},
              ("template", "prompt", "option", "option_template"), 100.0,
              "ReactBench Table 4's absurd contrast: the usual colour and 'every colour at once' are "
              "never right (the object was recoloured)"),
)


@dataclass(frozen=True)
class GroupAudit:
    """One group's held-out accuracies (%) per rule and the number of guesses behind each."""
    benchmark: str
    kind: str
    group: tuple  # GROUP_FIELDS' values, then the number of options (None but for "option")
    accuracy: dict
    guesses: dict

    @property
    def n_test(self) -> int:
        return self.guesses["constant"]

    @property
    def lift(self) -> float:
        return max(self.accuracy.values()) - self.accuracy["constant"]

    @property
    def best_rule(self) -> str:
        return max(self.accuracy, key=lambda r: (self.accuracy[r], -RULES.index(r)))

    @property
    def fields(self) -> dict:
        return dict(zip(GROUP_FIELDS, self.group))

    def paper_made(self) -> PaperMade | None:
        """The :data:`PAPER_MADE` entry that explains this group's lift: its benchmark, kind and
        fields match, the best rule is one it names, and the lift is within its bound."""
        return next((p for p in PAPER_MADE if p.benchmark == self.benchmark and p.kind == self.kind
                     and all(self.fields.get(f) in allowed for f, allowed in p.match.items())
                     and self.best_rule in p.rules and self.lift <= p.max_lift + 1e-9), None)


def _masked_words() -> frozenset[str]:
    from ..organism.tasks import NUMBERS
    from ..world import CATEGORIES, COLOURS

    return frozenset({*CATEGORIES, *COLOURS, *NUMBERS})


def _tokens(text: str) -> list[str]:
    return re.findall(r"[\w']+|[^\w\s]", text.lower())


def mask_words(words) -> frozenset[str]:
    """The world's object, colour and number words and ``words`` (a phrase counts word by word)."""
    return _masked_words() | {t for w in words for t in _tokens(w)}


def template(prompt: str, masked: frozenset[str] | None = None) -> str:
    """``prompt`` with masked words, their plurals and possessives, and digits replaced by ``_``."""
    masked = _masked_words() if masked is None else masked

    def hidden(token: str) -> bool:
        stem = token[:-2] if token.endswith("'s") else token[:-1] if token.endswith("s") else token
        return token in masked or stem in masked or token.isdigit()

    return " ".join("_" if hidden(t) else t for t in _tokens(prompt))


def group_of(query) -> tuple:
    n_options = len(query.options) if query.kind == "option" and query.options else None
    return (query.benchmark, query.kind, *(query.record.get(f) for f in GROUP_FIELDS), n_options)


def _truth(query) -> str:
    return str(query.truth).strip().lower()


def _commonest(counter: Counter) -> str:
    """The commonest value, ties broken by the value's text (so the audit is deterministic)."""
    top = max(counter.values())
    return min(v for v, c in counter.items() if c == top)


def _audited(queries: list) -> list:
    """The queries a text rule can be scored on. Queries whose images are missing stay: the
    audit reads no image."""
    return [q for q in queries if q.kind in AUDITED_KINDS and q.truth is not None]


@dataclass
class _Fitted:
    """What the rules learned from one group's fit queries."""
    constant: str
    per_template: dict
    per_prompt: dict
    right: Counter  # per ("text" | "template", option text): times it was the right option
    shown: Counter  # ... and times it was offered


def _fit(queries: list, masked: frozenset[str]) -> _Fitted:
    fitted = _Fitted(_commonest(Counter(_truth(q) for q in queries)), defaultdict(Counter), defaultdict(Counter),
                     Counter(), Counter())
    for q in queries:
        fitted.per_template[template(q.prompt, masked)][_truth(q)] += 1
        fitted.per_prompt[q.prompt][_truth(q)] += 1
        for letter, text in zip(OPTION_LETTERS, q.options or () if q.kind == "option" else ()):
            for key in (("text", text), ("template", template(text, masked))):
                fitted.shown[key] += 1
                fitted.right[key] += letter == _truth(q)
    return fitted


def _guesses(fitted: _Fitted, q, masked: frozenset[str]) -> dict[str, str]:
    """Each rule's answer to ``q``, from what it was fitted on."""
    tmpl = template(q.prompt, masked)
    by_template = _commonest(fitted.per_template[tmpl]) if tmpl in fitted.per_template else fitted.constant
    guesses = {"constant": fitted.constant, "template": by_template,
               "prompt": _commonest(fitted.per_prompt[q.prompt]) if q.prompt in fitted.per_prompt else by_template}
    if q.kind == "option" and q.options:
        letters = OPTION_LETTERS[:len(q.options)]
        masks = [template(t, masked) for t in q.options]
        for rule, keys in (("option", [("text", t) for t in q.options]),
                           ("option_template", [("template", m) for m in masks])):
            rates = [(fitted.right[k] + 1) / (fitted.shown[k] + 2) for k in keys]
            tied = [letter for letter, r in zip(letters, rates) if r == max(rates)]
            guesses[rule] = fitted.constant if fitted.constant in tied else tied[0]
        alone = [letter for letter, m in zip(letters, masks) if masks.count(m) == 1]
        guesses["odd_one_out"] = alone[0] if len(alone) == 1 else fitted.constant
    return guesses


def _fit_groups(queries: list, masked: frozenset[str]) -> dict[tuple, _Fitted]:
    """The rules fitted on each group of ``queries``."""
    groups: dict[tuple, list] = defaultdict(list)
    for q in _audited(queries):
        groups[group_of(q)].append(q)
    return {key: _fit(members, masked) for key, members in groups.items()}


def _tally(fitted: dict[tuple, _Fitted], test: list, masked: frozenset[str]) -> dict[tuple, tuple[Counter, Counter]]:
    """Per group of ``test``: (right guesses, guesses) per rule, the rules ``fitted`` on that
    group. Groups ``fitted`` lacks are left out."""
    out: dict[tuple, tuple[Counter, Counter]] = {}
    for q in _audited(test):
        key = group_of(q)
        if key not in fitted:
            continue
        hits, made = out.setdefault(key, (Counter(), Counter()))
        for rule, guess in _guesses(fitted[key], q, masked).items():
            made[rule] += 1
            hits[rule] += guess == _truth(q)
    return out


def audit(pairs: list[tuple[list, list]], mask=()) -> list[GroupAudit]:
    """Per group, each text-only rule's held-out accuracy pooled over ``pairs`` of (fit
    queries, test queries). ``mask``: more words the templates hide (your object names)."""
    masked = mask_words(mask)
    hits: dict[tuple, Counter] = defaultdict(Counter)
    made: dict[tuple, Counter] = defaultdict(Counter)
    fitted: dict[int, dict] = {}  # each list is fitted once, however many pairs it is in
    for fit, test in pairs:
        if id(fit) not in fitted:
            fitted[id(fit)] = _fit_groups(fit, masked)
        for key, (h, m) in _tally(fitted[id(fit)], test, masked).items():
            hits[key].update(h)
            made[key].update(m)
    return [GroupAudit(key[0], key[1], key[2:], {r: 100.0 * hits[key][r] / made[key][r] for r in RULES if made[key][r]},
                       {r: made[key][r] for r in RULES if made[key][r]})
            for key in sorted(made, key=repr)]


def both_ways(*query_lists: list) -> list[tuple[list, list]]:
    """Every ordered (fit, test) pair of the lists: each fitted on one, scored on another."""
    return list(itertools.permutations(query_lists, 2))


def split_units(queries: list) -> tuple[list, list]:
    """``queries`` in two halves of whole samples, by a hash of each sample (its unit field --
    a scene group, an image pair, a MIOH image set -- else its image files, else its id), so
    that neither the file's order nor a sample's several questions decide the halves."""
    from ..query import UNIT_FIELDS, unit_of

    def unit(q) -> str:
        if any(q.record.get(f) is not None for f in UNIT_FIELDS):
            return unit_of(q)
        paths = [str(getattr(image, "path", "")) for image in q.images]
        return "|".join(paths) if all(paths) and paths else q.id

    halves: tuple[list, list] = ([], [])
    for q in queries:
        halves[hashlib.sha256(unit(q).encode()).digest()[0] % 2].append(q)
    return halves


def format_table(rows: list[GroupAudit]) -> str:
    """Markdown, largest lift first; a paper-made lift says so (its reasons listed below)."""
    head = "| benchmark | kind | group (" + ", ".join(GROUP_FIELDS) + ", options) | test items | " + " | ".join(RULES) + " | lift |"
    lines = [head, "|" + "---|" * (5 + len(RULES))]
    reasons: list[str] = []
    for r in sorted(rows, key=lambda r: (-r.lift, r.benchmark, repr(r.group))):
        group = ", ".join(str(v) for v in r.group if v is not None) or "-"
        cells = " | ".join(f"{r.accuracy[k]:.1f}" if k in r.accuracy else "" for k in RULES)
        made = r.paper_made() if r.lift > 0 else None
        if made and made.why not in reasons:
            reasons.append(made.why)
        note = f" paper-made [{reasons.index(made.why) + 1}]" if made else ""
        if r.accuracy["constant"] >= ONE_ANSWER:
            note += " (one answer)"
        lines.append(f"| {r.benchmark} | {r.kind} | {group} | {r.n_test} | {cells} | {r.lift:+.1f} ({r.best_rule}){note} |")
    if reasons:
        lines += ["", *(f"[{i}] {why}" for i, why in enumerate(reasons, 1))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .suites import SCALES, SUITE_NAMES, build_suite, chosen_tasks

    parser = argparse.ArgumentParser(prog="python -m evaluators.benchmarks.blind_audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=None,
                        help="comma-separated built-in suites ('' for none; default: all, none when --data is given)")
    parser.add_argument("--scale", default="large", choices=sorted(SCALES),
                        help="large by default: at full, groups of 12 items give chance lifts of 25-33 points")
    parser.add_argument("--seeds", default="10,11,20", help="suite seeds (two or more): rules fitted on each, scored on the others")
    parser.add_argument("--data", default="",
                        help="your data, benchmark=path[,benchmark=path] in native formats (as vlm-eval reads it): "
                             "audited on two halves of its samples, both ways")
    parser.add_argument("--mask", default="", help="comma-separated words the templates mask too (your object names)")
    parser.add_argument("--min-lift", type=float, default=0.0, help="show groups whose lift is at least this")
    args = parser.parse_args(argv)
    try:
        tasks = chosen_tasks(args.tasks, args.data, ",".join(SUITE_NAMES), pooled=False)  # audited apart
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if len(seeds) < 2 or len(set(seeds)) < len(seeds):
            raise ValueError(f"--seeds: two or more different seeds (a rule scored on the scenes it was fitted on "
                             f"memorises them), got {args.seeds!r}")
        from ..cli import parse_kv
        from .protocols import load_data

        data = {bench: load_data({bench: path}) for bench, path in parse_kv(args.data, "--data", "benchmark=path").items()}
    except ValueError as err:
        parser.error(str(err))
    mask = [w.strip() for w in args.mask.split(",") if w.strip()]
    rows = []
    for task in tasks:
        rows += audit(both_ways(*(build_suite(task, s, args.scale) for s in seeds)), mask)
    for queries in data.values():
        rows += audit(both_ways(*split_units(queries)), mask)
    if not rows:
        print("nothing to audit: no yes/no, option, number or choice question has a group in both halves")
        return 1
    print(format_table([r for r in rows if r.lift >= args.min_lift]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
