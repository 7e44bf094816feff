"""ReactBench has no public release: one JSON Lines record per question (Sec. 3; four
tasks, three question types, inducing dimensions for RE/CA, tracing hints for AT, exact or
interval queries for DC)."""

from ...schema import Field, load_jsonl

TASKS = ("relational_erasure", "counterfactual_attribute", "alteration_tracing", "dense_counting")
SCHEMA = (
    Field("id", (str, int), doc="unique question id"),
    Field("task", str, choices=TASKS, doc="the cause-driven task"),
    Field("images", list, images=True, doc="one image; [before, after] for alteration tracing (checked)"),
    Field("question", str, doc="the question text"),
    Field("question_type", str, choices=("MC", "SA", "YN"), doc="multiple choice, short answer, yes/no"),
    Field("options", list, optional=True, doc="MC options (non-empty texts), in letter order"),
    Field("answer", (str, int), doc="option letter (MC), yes/no (YN), or the short answer (SA, graded on its content words: not a, the, was ...); a count for DC, inside `interval` for an interval query"),
    Field("inducing", str, optional=True, choices=("direct", "commonsense", "premise", "absurd"),
          doc="inducing dimension (relational erasure, counterfactual attribute only; left out: 'not given' in the breakdown)"),
    Field("hint", str, optional=True, choices=("none", "location", "operation"), doc="alteration tracing hint (that task only)"),
    Field("count_query", str, optional=True, choices=("exact", "interval"), doc="dense counting setting (that task only; left out: graded as exact)"),
    Field("mode", str, optional=True, choices=("standard", "cot"),
          doc="prompting mode the question is asked in (default standard; cot = chain of thought)"),
    Field("interval", list, optional=True, doc="[low, high] bounds of an interval count answer"),
    Field("synonyms", list, optional=True, doc="accepted short-answer variants"),
)


def load(path, image_root=None):
    return load_jsonl(path, SCHEMA, image_root)
