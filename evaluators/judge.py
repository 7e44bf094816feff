"""An LLM judge for the answers a paper grades with one: ReactBench (App. C.1).

ReactBench grades the answers to all its question types -- multiple choice, yes/no and short
answers -- with an LLM judge (App. C.1, "Figure 24 presents the prompt template used for
LLM-based answer evaluation across all question types"). The toolkit grades by rule
(:mod:`evaluators.answers`), which reads the forms models write but not meaning: a short
answer in other words than its reference and its synonyms is wrong by rule where a judge
may accept it (``reactbench.metrics``' notes). With a judge -- any text model the user has,
through :class:`HFJudge`, or any object with ``describe()`` and ``__call__`` (an API client)
-- ``evaluators.runner.run(..., judge=...)`` and ``vlm-eval --judge MODEL`` grade those
answers as the paper does, and keep the rule's grade beside the judge's in every record
(``rule_correct``), with how often the two agree.

Choices (the paper is silent or not available as text):

* **The prompt is ours** (:data:`JUDGE_TEMPLATE`): Fig. 24 is an image whose text the paper's
  body does not give, and the judge model is not named. Ours gives the judge the question as
  asked, the reference answer as the data writes it (:func:`reference_text`) and the answer,
  and asks for one word. A caller can pass the paper's prompt as ``template`` (it must hold
  ``{question}``, ``{reference}`` and ``{answer}``).
* **Only ReactBench is judged** (:data:`JUDGED_BENCHMARKS`): the other four papers grade by
  rule -- DO-Bench and Causal-HalBench read yes/no (and CHAIR's object words), MIOH options,
  HalluSegBench masks -- so a judge there would not be their protocol.
* **An unreadable verdict is an invalid grade**: the record is wrong and ``invalid``, as an
  answer the rules cannot read is, and counted apart (``unreadable_verdicts``); it is not
  graded by rule instead, which would mix two graders without saying where. A reply is read
  for "correct" / "incorrect" only (:func:`parse_verdict`).
* **A query that could not be asked** (a missing image: no answer) is not sent to the judge;
  it stays out of the scores as before.

Verdicts are kept in ``<output_dir>/judgements.jsonl``, keyed by query id, a digest of what
the judge read (question, reference and answer) and a digest of the judge's
:meth:`describe` (its model, dtype, revision and prompt): a rerun or a resumed run asks the
judge only about what it has not graded, and another judge (or prompt, or reference) grades
again. ``samples.jsonl`` says how the last run graded: a run without a judge puts the rule's
grades back (:func:`rule_graded`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from .answers import OPTION_LETTERS, after_reasoning
from .query import Query, keyword_alternatives

#: Benchmarks whose paper grades answers with an LLM judge (module docstring).
JUDGED_BENCHMARKS = ("reactbench",)

#: The judge's prompt (ours: the paper's Fig. 24 is not available as text).
JUDGE_TEMPLATE = (
    "You are grading an answer to a question about one image or a pair of images. You do not see "
    "the images: judge only whether the answer agrees with the reference answer.\n\n"
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Answer to grade: {answer}\n\n"
    "The answer is correct if its final answer means the same as the reference answer: other words "
    "with the same meaning, a number written in words, or an option given by its letter or by its "
    "text all count. It is incorrect if it says something else, names several candidates, refuses "
    "or does not answer. Reply with one word: correct or incorrect."
)

#: The file of a run's output folder that keeps the judge's verdicts.
JUDGEMENTS = "judgements.jsonl"

#: A verdict word with the qualifier before it that makes "correct" a "no" ("not correct",
#: "isn't correct", "partially correct"); ``\bcorrect\b`` does not match inside "incorrect".
_VERDICT = re.compile(r"\b(?:(not|isn't|isnt|is not|not quite|not entirely|not fully|not completely|partially|partly"
                      r"|half)\s+)?(incorrect|correct)\b")
#: The choice the prompt offers, echoed back ("correct or incorrect: incorrect"): no verdict.
_ECHO = re.compile(r"\b(?:correct\s+or\s+incorrect|incorrect\s+or\s+correct)\b")


@dataclass(frozen=True)
class JudgeItem:
    """What the judge reads about one answer."""

    question: str
    reference: str
    answer: str


class Judge(Protocol):
    """What :func:`judge_records` needs of a judge: ``describe()`` (a JSON-able dict naming
    the model and prompt: verdicts are kept per description) and ``__call__(items)``, the
    judge's raw reply to each item, in order (:func:`parse_verdict` reads it)."""

    def describe(self) -> dict[str, Any]: ...

    def __call__(self, items: Sequence[JudgeItem]) -> list[str]: ...


def parse_verdict(text: Any) -> bool | None:
    """The judge's reply as a grade, from its first verdict word: True for "correct", False
    for "incorrect" and for a "correct" that a word before it takes back ("not correct",
    "isn't correct", "partially correct"); None when it says neither (or is not text). The
    prompt's own choice echoed back ("correct or incorrect: ...") is skipped. "Right" and
    "wrong" are not read: the prompt asks for correct or incorrect, and "right" is also a
    direction in ReactBench's answers ("moved to the right")."""
    if not isinstance(text, str):
        return None
    match = _VERDICT.search(_ECHO.sub(" ", text.lower()))
    if match is None:
        return None
    return match.group(2) == "correct" and match.group(1) is None


def reference_text(query: Query) -> str:
    """The reference answer the judge compares with: the data's own wording where the
    protocol kept it (``query.reference``), else the ground truth in words -- the option's
    letter and text, the count, the interval, the short answer's words and their accepted
    alternatives."""
    if query.reference:
        return query.reference
    truth = query.truth
    if query.kind == "option":  # the letter as the data writes it (the suite's and users' are lower case)
        index = OPTION_LETTERS.find(str(truth).lower()) if isinstance(truth, str) and len(truth) == 1 else -1
        options = query.options or []
        return f"{truth} ({options[index]})" if 0 <= index < len(options) else str(truth)
    if query.kind == "interval":
        low, high = truth
        return f"any number from {low} to {high}"
    if query.kind == "keywords":
        return " / or: ".join(" ".join(alt) for alt in keyword_alternatives(truth))
    return str(truth)


def question_text(query: Query) -> str:
    """The question as the judge reads it: the prompt, with a multiple choice's options
    appended when the prompt does not spell them all out (a users' file may keep them apart)."""
    options = query.options if query.kind == "option" else None
    if options and not all(str(o) in query.prompt for o in options):
        # letters in the case of the truth's, so that the reference names the option as listed
        letters = OPTION_LETTERS.upper() if str(query.truth).isupper() else OPTION_LETTERS
        return query.prompt + " Options: " + " ".join(f"{letters[i]}) {o}" for i, o in enumerate(options))
    return query.prompt


def judge_digest(judge: Judge) -> str:
    """A digest of what the judge is (its :meth:`describe`): verdicts are reused only under it."""
    return hashlib.sha256(json.dumps(judge.describe(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _item_digest(item: JudgeItem) -> str:
    """What a verdict was given on: the question, the reference and the answer as the judge
    read them (a synonym added to the data, or a reference worded anew, is judged again)."""
    return hashlib.sha256(json.dumps([item.question, item.reference, item.answer]).encode()).hexdigest()[:16]


def check_judge(judge: Any) -> None:
    """A ``ValueError`` unless ``judge`` has ``describe()`` and can be called."""
    if not callable(judge) or not callable(getattr(judge, "describe", None)):
        raise ValueError(f"judge must be callable on a list of JudgeItem and have describe(); got {judge!r}")


def _read_cache(path: Path) -> dict[tuple[str, str, str], str]:
    cache: dict[tuple[str, str, str], str] = {}
    if not path.exists():
        return cache
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            cache[(row["id"], row["item_sha"], row["judge"])] = row["output"]
        except (ValueError, KeyError, TypeError):  # a torn last line of a killed run: asked again
            continue
    return cache


def judge_records(records: Sequence[dict], queries: Mapping[str, Query], judge: Judge,
                  folder: str | Path | None = None, batch_size: int | None = None) -> tuple[list[dict], dict]:
    """``records`` (one per query, as :func:`evaluators.query.to_record` writes them) with the
    answers of :data:`JUDGED_BENCHMARKS` graded by ``judge``, and a summary per benchmark.

    A judged record keeps the rule's grade as ``rule_correct`` / ``rule_invalid`` and gets
    ``graded_by: "judge"``, the judge's reply (``judge_output``), ``correct`` (the verdict
    is "correct") and ``invalid`` (the reply holds no verdict). Records of other benchmarks,
    and of queries that could not be asked, are returned as they are. ``folder``: where
    :data:`JUDGEMENTS` keeps the verdicts between runs (None: nothing kept); ``batch_size``:
    items per call of the judge (None: the judge's own ``batch_size``, else 8).

    The rule's grade is read from each record's ``correct`` / ``invalid``; a record a judge
    graded before (``graded_by``) is read back to its rule grade first, so that
    ``rule_correct`` and the agreement figure are the rule's on a rerun too."""
    check_judge(judge)
    if batch_size is None:
        batch_size = getattr(judge, "batch_size", None) or 8
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    records = [rule_graded(r) for r in records]
    digest = judge_digest(judge)
    path = Path(folder) / JUDGEMENTS if folder is not None else None
    cache = _read_cache(path) if path is not None else {}
    # the judge grades what was answered, not a reasoning model's think block; an answer cut
    # off while thinking answered nothing and keeps the rules' grade (unreadable)
    todo = [i for i, r in enumerate(records)
            if r.get("benchmark") in JUDGED_BENCHMARKS and not r.get("invalid_input")
            and isinstance(r.get("answer"), str) and r.get("id") in queries and after_reasoning(r["answer"]) is not None]
    outputs: dict[int, str] = {}
    items = {i: JudgeItem(question_text(queries[records[i]["id"]]), reference_text(queries[records[i]["id"]]),
                          after_reasoning(records[i]["answer"])) for i in todo}
    ask = []
    for i in todo:
        key = (records[i]["id"], _item_digest(items[i]), digest)
        if key in cache:
            outputs[i] = cache[key]
        else:
            ask.append(i)
    asked = set(ask)
    for start in range(0, len(ask), batch_size):
        chunk = ask[start : start + batch_size]
        replies = judge([items[i] for i in chunk])
        if not isinstance(replies, (list, tuple)) or len(replies) != len(chunk):
            got = len(replies) if isinstance(replies, (list, tuple)) else type(replies).__name__
            raise RuntimeError(f"the judge replied {got} times to {len(chunk)} items")
        lines = []
        for i, reply in zip(chunk, replies):
            outputs[i] = reply if isinstance(reply, str) else str(reply)
            lines.append(json.dumps({"id": records[i]["id"], "item_sha": _item_digest(items[i]), "judge": digest,
                                     "output": outputs[i]}) + "\n")
        if path is not None:  # appended batch by batch: a killed run keeps what was judged
            torn = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
            with path.open("a") as f:
                f.writelines(["\n"] * bool(torn) + lines)  # a killed run's torn line stays alone
    out = list(records)
    summary: dict[str, dict] = {}
    for i, reply in outputs.items():
        r = records[i]
        verdict = parse_verdict(reply)
        out[i] = {**r, "graded_by": "judge", "rule_correct": r.get("correct"), "rule_invalid": r.get("invalid"),
                  "judge_output": reply, "correct": verdict is True, "invalid": verdict is None}
        s = summary.setdefault(r["benchmark"], {"judged": 0, "from_cache": 0, "unreadable_verdicts": 0,
                                                "both_readable": 0, "agree": 0})
        s["judged"] += 1
        s["from_cache"] += i not in asked
        s["unreadable_verdicts"] += verdict is None
        if verdict is not None and not r.get("invalid"):
            s["both_readable"] += 1
            s["agree"] += verdict == bool(r.get("correct"))
    for bench, s in summary.items():
        both = s.pop("both_readable")
        agree = s.pop("agree")
        # over the answers both graders could read: how often the rule's grade is the judge's
        s["agreement_with_rules"] = 100.0 * agree / both if both else float("nan")
        s["answers_both_read"] = both
    return out, summary


#: The fields :func:`judge_records` adds to a record.
JUDGE_FIELDS = ("graded_by", "judge_output", "rule_correct", "rule_invalid")


def rule_graded(record: dict) -> dict:
    """``record`` as the rules graded it: a judged record's ``correct`` / ``invalid`` put
    back from ``rule_correct`` / ``rule_invalid`` and the judge's fields dropped; any other
    record as it is. A run without a judge scores by rule whatever an earlier run in the
    folder did, and a run with one judges again (from :data:`JUDGEMENTS`, at no cost)."""
    if record.get("graded_by") != "judge":
        return record
    out = {k: v for k, v in record.items() if k not in JUDGE_FIELDS}
    out["correct"], out["invalid"] = record.get("rule_correct"), record.get("rule_invalid")
    return out


class CallableJudge:
    """A judge from a function ``fn(question, reference, answer) -> str`` (the judge's reply,
    read by :func:`parse_verdict`): an API client, a human's notes, a rule of your own.
    ``name`` tells two judges apart in the kept verdicts: two lambdas of one module, or two
    closures of one function, look alike unless named (as
    :class:`evaluators.model.CallableModel`'s)."""

    def __init__(self, fn: Any, name: str = "callable") -> None:
        if not callable(fn):
            raise ValueError("fn must be callable: fn(question, reference, answer) -> str")
        self.fn, self.name = fn, name

    def describe(self) -> dict[str, Any]:
        from .model import callable_name

        return {"name": self.name, "class": "callable", "fn": callable_name(self.fn)}

    def __call__(self, items: Sequence[JudgeItem]) -> list[str]:
        return [self.fn(item.question, item.reference, item.answer) for item in items]


class HFJudge:
    """A judge from a Hugging Face text model: ``HFJudge("Qwen/Qwen2.5-7B-Instruct",
    dtype="bf16", device="cuda")`` (a folder or Hub id, loaded with ``AutoModelForCausalLM``
    and the same keyword arguments as ``vlm-eval --model_args``), or ``HFJudge(model,
    tokenizer)`` for one already loaded. Greedy, ``max_new_tokens`` per reply, in batches of
    ``batch_size`` with left padding; the prompt goes through the tokenizer's chat template
    where it has one."""

    def __init__(self, model: Any, tokenizer: Any = None, *, template: str = JUDGE_TEMPLATE,
                 max_new_tokens: int = 8, batch_size: int = 8, name: str | None = None, **load_args: Any) -> None:
        for key in ("{question}", "{reference}", "{answer}"):
            if key not in template:
                raise ValueError(f"template must hold {key}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from .model import _load_kwargs, from_pretrained

            kwargs, device = _load_kwargs(**load_args)
            name = name or str(model)
            spec = str(model)
            model = from_pretrained(AutoModelForCausalLM, spec, **kwargs)
            if device:
                model = model.to(device)
            tokenizer = tokenizer if tokenizer is not None else from_pretrained(AutoTokenizer, spec)
        elif load_args:
            raise ValueError(f"{sorted(load_args)}: loading arguments apply to a model given by name or folder")
        if tokenizer is None:
            raise ValueError("tokenizer: a judge model given as an object needs its tokenizer")
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError("tokenizer: the judge's tokenizer has neither a pad nor an end token to pad batches with")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.template, self.max_new_tokens, self.batch_size = template, max_new_tokens, batch_size
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__

    def describe(self) -> dict[str, Any]:
        """The model (name, class, dtype, the Hub revision it was loaded at where known), the
        prompt's digest and the reply length: verdicts are kept per description. Weights
        changed in place under the same name and revision are not seen; give ``name``."""
        return {"name": self.name, "class": type(self.model).__name__, "dtype": str(self.model.dtype),
                "revision": getattr(self.model.config, "_commit_hash", None),
                "template_sha256": hashlib.sha256(self.template.encode()).hexdigest()[:16],
                "max_new_tokens": self.max_new_tokens}

    def prompt(self, item: JudgeItem) -> str:
        """The text the judge model reads for ``item`` (chat-templated where it has a template)."""
        text = self.template.format(question=item.question, reference=item.reference, answer=item.answer)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    def __call__(self, items: Sequence[JudgeItem]) -> list[str]:
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        templated = bool(getattr(tok, "chat_template", None))  # the template writes its own special tokens
        side = tok.padding_side
        replies: list[str] = []
        try:
            tok.padding_side = "left"  # generation continues every row from its last real token
            for start in range(0, len(items), self.batch_size):
                texts = [self.prompt(item) for item in items[start : start + self.batch_size]]
                if tok.pad_token_id is None:
                    ids = [tok(t, add_special_tokens=not templated)["input_ids"] for t in texts]
                    longest = max(len(i) for i in ids)
                    enc = {"input_ids": torch.tensor([[pad] * (longest - len(i)) + i for i in ids]),
                           "attention_mask": torch.tensor([[0] * (longest - len(i)) + [1] * len(i) for i in ids])}
                else:
                    enc = dict(tok(texts, return_tensors="pt", padding=True, add_special_tokens=not templated))
                device = next(self.model.parameters()).device
                enc = {k: v.to(device) for k, v in enc.items()}
                with torch.no_grad():
                    out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                              pad_token_id=pad)
                new = out[:, enc["input_ids"].shape[1] :]
                replies += [t.strip() for t in tok.batch_decode(new, skip_special_tokens=True)]
        finally:
            tok.padding_side = side
        return replies
