"""The LLM judge for ReactBench's answers (App. C.1): verdict reading, what the judge is
shown, how its grades replace the rule's (and are kept, reused and re-read), and an HF
text model as the judge (a tiny random Llama: wiring, batching, padding)."""

from __future__ import annotations

import json

import pytest

from evaluators.judge import (JUDGEMENTS, CallableJudge, HFJudge, JudgeItem, judge_records, parse_verdict,
                              question_text, reference_text)
from evaluators.model import CallableModel
from evaluators.query import Query, regrade, to_record
from evaluators.runner import SAMPLES, read_samples, run


@pytest.mark.parametrize("reply, verdict", [
    ("Correct.", True), ("correct", True), ("I think it is correct", True), ("Incorrect", False),
    ("The answer is not correct.", False), ("The answer isn't correct.", False), ("Not quite correct.", False),
    ("not entirely correct", False), ("Partially correct.", False), ("INCORRECT.", False),
    ("Incorrect. The reference says correct things.", False),  # the first verdict word decides
    ("correct or incorrect: incorrect", False),  # the prompt's choice echoed back is no verdict
    ("The dog moved right, incorrect", False),  # "right" is a direction here, not a verdict
    ("The answer is right.", None), ("wrong", None),  # the prompt asks for correct or incorrect
    ("", None), ("maybe", None), ("correctly", None), (None, None), (3, None)])
def test_parse_verdict(reply, verdict):
    assert parse_verdict(reply) is verdict


def _q(kind, truth, prompt="how many forks ?", options=None, reference=None, qid="q", bench="reactbench"):
    return Query(qid, bench, [], prompt, kind, truth, {"task": "relational_erasure", "qtype": "SA"},
                 options=options, reference=reference)


def test_reference_and_question_texts():
    mc = _q("option", "B", prompt="what is on the plate ?", options=["a knife", "a fork", "a cup"])
    assert reference_text(mc) == "B (a fork)"
    # a users' file keeps its options apart from the question: the judge is shown them
    assert question_text(mc) == "what is on the plate ? Options: A) a knife B) a fork C) a cup"
    # letters as the loaders and the suite write them, lower case: named in the same case
    lower = _q("option", "b", prompt="what is on the plate ?", options=["a knife", "a fork", "a cup"])
    assert reference_text(lower) == "b (a fork)"
    assert question_text(lower) == "what is on the plate ? Options: a) a knife b) a fork c) a cup"
    spelled = _q("option", "A", prompt="what ? A ) a knife B ) a fork", options=["a knife", "a fork"])
    assert question_text(spelled) == spelled.prompt
    assert reference_text(_q("interval", (6, 7))) == "any number from 6 to 7"
    assert reference_text(_q("number", 3)) == "3"
    assert reference_text(_q("yes_no", "no")) == "no"
    assert reference_text(_q("keywords", [["fork", "removed"], ["utensil"]])) == "fork removed / or: utensil"
    assert reference_text(_q("keywords", [["fork"]], reference="the fork (also accepted: utensil)")) \
        == "the fork (also accepted: utensil)"


def _judged_setup():
    queries = {"a": _q("keywords", [["fork"]], qid="a"), "b": _q("number", 3, qid="b"),
               "c": _q("yes_no", "yes", prompt="is there a fork ?", qid="c"),
               "d": _q("yes_no", "yes", prompt="is there a fork ?", qid="d", bench="dobench")}
    answers = {"a": "a utensil", "b": "three of them", "c": "I am not sure", "d": "yes"}
    records = [to_record(queries[i], answers[i]) for i in "abcd"]
    records.append({"id": "e", "benchmark": "reactbench", "answer": None, "invalid_input": "missing image",
                    "invalid": True, "correct": False})
    return queries, records


def test_judge_grades_replace_the_rules_and_keep_them(tmp_path):
    queries, records = _judged_setup()
    seen = []

    def fn(question, reference, answer):
        seen.append((question, reference, answer))
        return {"a utensil": "Correct", "three of them": "Incorrect", "I am not sure": "hmm"}[answer]

    out, summary = judge_records(records, queries, CallableJudge(fn, "scripted"), tmp_path)
    by_id = {r["id"]: r for r in out}
    # the rule read "a utensil" as wrong (not the keyword) and "three of them" as right
    assert by_id["a"]["rule_correct"] is False and by_id["a"]["correct"] is True and by_id["a"]["invalid"] is False
    assert by_id["b"]["rule_correct"] is True and by_id["b"]["correct"] is False
    # a reply without a verdict is an invalid grade: wrong, counted, not graded by rule instead
    assert by_id["c"]["correct"] is False and by_id["c"]["invalid"] is True and by_id["c"]["judge_output"] == "hmm"
    assert {r["graded_by"] for r in out if r["id"] in "abc"} == {"judge"}
    # other benchmarks (their papers grade by rule) and unasked inputs are left as they were
    assert by_id["d"] == records[3] and by_id["e"] == records[4]
    assert [s[2] for s in seen] == ["a utensil", "three of them", "I am not sure"]
    assert seen[0][1] == "fork"
    assert summary == {"reactbench": {"judged": 3, "from_cache": 0, "unreadable_verdicts": 1,
                                      "agreement_with_rules": 0.0, "answers_both_read": 2}}
    assert len((tmp_path / JUDGEMENTS).read_text().splitlines()) == 3

    # a rerun asks the judge nothing it has graded; another judge grades everything again
    again, summary = judge_records(records, queries, CallableJudge(fn, "scripted"), tmp_path)
    assert again == out and summary["reactbench"]["from_cache"] == 3 and len(seen) == 3
    other = CallableJudge(lambda q, r, a: "correct", "another judge")
    regraded, _ = judge_records(records, queries, other, tmp_path)
    assert [r["correct"] for r in regraded[:3]] == [True, True, True]


def test_regrade_is_the_rules_grade_and_a_rejudged_record_keeps_the_rules():
    """A judged line graded again by rule drops the judge's fields (the runner judges again
    where a judge is given); judging a judged record again reads the rule's grade, not the
    earlier judge's, into rule_correct and the agreement figure."""
    queries, records = _judged_setup()
    out, first = judge_records(records, queries, CallableJudge(lambda q, r, a: "incorrect", "no"))
    again = regrade(out[1], queries["b"])
    assert again["correct"] is True and "graded_by" not in again and "rule_correct" not in again
    twice, second = judge_records(out, queries, CallableJudge(lambda q, r, a: "incorrect", "no"))
    assert twice == out and second == first


def test_a_changed_reference_is_judged_again(tmp_path):
    queries, records = _judged_setup()
    judge = CallableJudge(lambda q, r, a: "correct" if a in r else "incorrect", "substring")
    out, _ = judge_records(records, queries, judge, tmp_path)
    assert out[0]["correct"] is False  # "a utensil" is not in the reference "fork"
    queries["a"] = _q("keywords", [["fork"]], qid="a", reference="fork (also accepted: a utensil)")
    out, summary = judge_records(records, queries, judge, tmp_path)
    assert out[0]["correct"] is True and summary["reactbench"]["from_cache"] == 2


def test_a_torn_verdict_line_stays_alone(tmp_path):
    queries, records = _judged_setup()
    (tmp_path / JUDGEMENTS).write_text('{"id": "a", "item_sha": "x", "jud')  # a run killed mid-line
    judge_records(records, queries, CallableJudge(lambda q, r, a: "correct", "yes"), tmp_path)
    lines = (tmp_path / JUDGEMENTS).read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)["output"] == "correct" for line in lines[1:])


def test_a_judge_that_miscounts_its_replies_is_an_error():
    queries, records = _judged_setup()

    class Short(CallableJudge):
        def __call__(self, items):
            return ["correct"] * (len(items) - 1)

    with pytest.raises(RuntimeError, match="replied 2 times to 3 items"):
        judge_records(records, queries, Short(lambda *a: "", "short"))
    with pytest.raises(ValueError, match="describe"):
        judge_records(records, queries, lambda items: [])
    with pytest.raises(ValueError, match="fn must be callable"):
        CallableJudge("correct")


def test_run_with_a_judge_scores_by_its_grades(tmp_path):
    """ReactBench's built-in suite answered "yes" throughout: by rule only the yes/no
    questions whose truth is yes are right; a judge that accepts every answer makes every
    task 100, the records keep the rule's grade, and a resumed run asks the judge nothing."""
    from evaluators.benchmarks.dobench.suite import build as dobench
    from evaluators.benchmarks.reactbench.suite import build as react

    queries = react(n_per_task=2, seed=3, dimensions=("direct",), hints=("none",)) + dobench(n_scenes=1, seed=0)
    model = CallableModel(lambda images, prompt: "yes", "always yes")
    plain = run(queries, model, tmp_path / "plain", progress=False)
    assert plain["results"]["reactbench"]["relational_erasure"] == pytest.approx(0.0)
    calls = []

    def accept(question, reference, answer):
        calls.append(answer)
        return "Correct."

    judged = run(queries, model, tmp_path / "judged", progress=False, judge=CallableJudge(accept, "accept"))
    react_n = sum(q.benchmark == "reactbench" for q in queries)
    assert len(calls) == react_n
    for task in ("relational_erasure", "counterfactual_attribute", "alteration_tracing", "dense_counting"):
        assert judged["results"]["reactbench"][task] == pytest.approx(100.0)
    assert judged["results"]["dobench"] == plain["results"]["dobench"]  # graded by rule, as its paper does
    assert judged["judge"]["benchmarks"]["reactbench"]["judged"] == react_n
    lines = {r["id"]: r for r in read_samples(tmp_path / "judged" / SAMPLES)}
    rule = {r["id"]: r for r in read_samples(tmp_path / "plain" / SAMPLES)}
    for qid, r in lines.items():
        if r["benchmark"] == "reactbench":
            assert r["correct"] is True and r["rule_correct"] == rule[qid]["correct"]
    again = run(queries, model, tmp_path / "judged", progress=False, judge=CallableJudge(accept, "accept"))
    assert len(calls) == react_n and again["results"] == judged["results"] and again["judge"] == {
        **judged["judge"], "seconds": again["judge"]["seconds"],
        "benchmarks": {"reactbench": {**judged["judge"]["benchmarks"]["reactbench"], "from_cache": react_n}}}
    assert [(r.get("rule_correct"), r["correct"]) for r in read_samples(tmp_path / "judged" / SAMPLES)] == \
        [(r.get("rule_correct"), r["correct"]) for r in lines.values()]
    # without the judge the same folder is graded by rule again, and says so
    ruled = run(queries, model, tmp_path / "judged", progress=False)
    assert ruled["results"] == plain["results"] and "judge" not in ruled
    assert not any("graded_by" in r for r in read_samples(tmp_path / "judged" / SAMPLES))
    assert again["judge"]["benchmarks"]["reactbench"]["from_cache"] == react_n


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory):
    """A random 2-layer Llama over the organism's word-level tokenizer (it has a chat template)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from evaluators.organism import ORGANISM_DIR

    tok = AutoTokenizer.from_pretrained(ORGANISM_DIR)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_judge")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_hf_judge_batches_as_it_answers_one_at_a_time(tiny_judge):
    # a template that ends on the answer, so that a random model's replies differ by row
    short = "{question} {reference} {answer}"
    judge = HFJudge(str(tiny_judge), batch_size=3, max_new_tokens=5, template=short)
    items = [JudgeItem("is there a fork ?", "yes", "yes"), JudgeItem("how many dogs ?", "3", "there are three dogs"),
             JudgeItem("what colour is the cup ?", "red", "red"), JudgeItem("is there a cup ?", "no", "no , a fork")]
    batched = judge(items)
    alone = [HFJudge(judge.model, judge.tokenizer, batch_size=1, max_new_tokens=5, template=short)([item])[0]
             for item in items]
    assert batched == alone and all(isinstance(t, str) for t in batched)
    assert len(set(batched)) > 1  # the rows differ: each reply reads its own prompt, not a padded neighbour's
    assert judge.tokenizer.padding_side == "left"  # restored as it was
    prompt = judge.prompt(items[1])
    assert "how many dogs ?" in prompt and "there are three dogs" in prompt and prompt.startswith("USER:")
    described = judge.describe()
    assert described["name"] == str(tiny_judge) and described["class"] == "LlamaForCausalLM"
    assert described["dtype"] == "torch.float32"
    assert HFJudge(judge.model, judge.tokenizer).describe()["template_sha256"] != described["template_sha256"]


@pytest.mark.parametrize("kwargs, message", [
    ({"template": "grade {answer}"}, "template must hold {question}"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"batch_size": 0}, "batch_size"),
    ({"dtype": "bf16"}, "loading arguments"),
])
def test_hf_judge_bad_arguments(tiny_judge, kwargs, message):
    from transformers import AutoTokenizer, LlamaForCausalLM

    model, tok = LlamaForCausalLM.from_pretrained(tiny_judge), AutoTokenizer.from_pretrained(tiny_judge)
    with pytest.raises(ValueError, match=message):
        HFJudge(model, tok, **kwargs)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        HFJudge(model)


def test_cli_judge(tiny_judge, tmp_path, capsys):
    from evaluators.cli import main

    out = tmp_path / "run"
    assert main(["--model", "organism", "--tasks", "reactbench", "--scale", "small", "--limit", "3",
                 "--judge", str(tiny_judge), "--judge_args", "dtype=fp32,max_new_tokens=3", "--output_path", str(out),
                 "--no_progress"]) == 0
    printed = capsys.readouterr().out
    assert "answers graded by the judge" in printed
    payload = json.loads((out / "results.json").read_text())
    assert payload["judge"]["judge"]["name"] == str(tiny_judge) and payload["judge"]["judge"]["max_new_tokens"] == 3
    lines = read_samples(out / SAMPLES)
    assert lines and all(r["graded_by"] == "judge" for r in lines)
    assert len((out / JUDGEMENTS).read_text().splitlines()) == len(lines)
    for flags, message in [(["--tasks", "dobench", "--judge", str(tiny_judge)], "nothing here is graded by a judge"),
                           (["--tasks", "reactbench", "--judge_args", "dtype=fp32"], "without --judge"),
                           (["--tasks", "reactbench", "--judge_batch_size", "4"], "without --judge"),
                           (["--tasks", "reactbench", "--judge", str(tiny_judge), "--judge_args", "max_new_tokens=0"],
                            "max_new_tokens must be an integer >= 1"),
                           (["--tasks", "reactbench", "--judge", str(tmp_path / "nope")], "--judge: no such folder"),
                           (["--tasks", "reactbench", "--judge", str(tiny_judge), "--judge_args", "dtype=fp7"],
                            "--judge_args: dtype must be one of"),
                           (["--tasks", "reactbench", "--judge", str(tiny_judge), "--judge_batch_size", "0"],
                            "--judge_batch_size")]:
        with pytest.raises(SystemExit):
            main(["--model", "organism", "--scale", "small", "--limit", "3", "--output_path", str(tmp_path / "x"),
                  *flags])
        assert message in capsys.readouterr().err


def test_report_with_a_judge(tiny_judge, tmp_path, capsys):
    """vlm-report grades each arm's ReactBench answers with the judge, says so, and leaves
    the judge's time out of the arm's wall clock."""
    from evaluators.report.main import main

    out = tmp_path / "report"
    assert main(["--tasks", "reactbench", "--arms", "vcd-greedy", "--judge", str(tiny_judge), "--resamples", "100",
                 "--output_path", str(out), "--no_progress"]) == 0
    printed = capsys.readouterr().out
    assert "graded by the judge" in printed
    result = json.loads((out / "results.json").read_text())
    assert set(result["judge"]) == {"VCD (greedy)", "baseline (greedy)"}
    for arm, judged in result["judge"].items():
        assert judged["benchmarks"]["reactbench"]["judged"] > 0 and judged["seconds"] >= 0
    for folder in out.iterdir():
        if folder.is_dir():
            assert all(r["graded_by"] == "judge" for r in read_samples(folder / SAMPLES))
    page = (out / "report.html").read_text()
    assert f"reactbench graded by the judge <code>{tiny_judge}</code>" in page
    with pytest.raises(SystemExit):
        main(["--tasks", "dobench", "--judge", str(tiny_judge), "--output_path", str(tmp_path / "x")])
    assert "nothing here is graded by a judge" in capsys.readouterr().err


def test_the_judge_grades_what_a_reasoning_model_answered_not_its_thinking():
    """The judge sees the answer after the think block; an answer cut off while thinking
    answered nothing: the judge is not asked and the rules' unreadable grade stands."""
    queries = {"a": _q("number", 3, qid="a"), "b": _q("number", 3, qid="b")}
    answers = {"a": "<think>maybe 5, or 4</think>There are 3.", "b": "<think>one, two, maybe five"}
    records = [to_record(queries[i], answers[i]) for i in "ab"]
    seen = []

    def fn(question, reference, answer):
        seen.append(answer)
        return "Correct"

    out, summary = judge_records(records, queries, CallableJudge(fn, "scripted"))
    assert seen == ["There are 3."]
    by_id = {r["id"]: r for r in out}
    assert by_id["a"]["correct"] is True and by_id["b"] == records[1] and records[1]["invalid"] is True
    assert summary["reactbench"]["judged"] == 1
