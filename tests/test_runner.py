"""The runner: scripted models give hand-computed DO-Bench numbers; a killed run resumes
with nothing lost or duplicated; invalid inputs are counted; the CLI runs end to end."""

from __future__ import annotations

import json
import math

import pytest

from evaluators.benchmarks.dobench.suite import build
from evaluators.model import CallableModel
from evaluators.runner import RESULTS, SAMPLES, read_samples, run
from evaluators.organism.tasks import OPTION_LETTERS


@pytest.fixture(scope="module")
def queries():
    return build(n_scenes=4, seed=1)


def test_suite_follows_the_ten_instance_protocol(queries):
    assert len(queries) == 40
    one = [q.record for q in queries if q.record["scene_id"] == queries[0].record["scene_id"]]
    cells = sorted((r["series"], r["level"], r["view"]) for r in one)
    assert cells == sorted([("A", l, "Full") for l in range(4)] + [("B", l, "Full") for l in range(4)]
                           + [("A", 0, "Cluster"), ("A", 0, "Crop")])
    assert {q.truth for q in queries if q.record["series"] == "A"} == {"yes"}


def test_always_yes_gives_the_hand_computed_scores(queries, tmp_path):
    payload = run(queries, CallableModel(lambda images, prompt: "Yes."), tmp_path, batch_size=7, progress=False)
    res = payload["results"]["dobench"]
    # FN = 0 everywhere, FP = 100% at every B level -> A_AUC = 0, B_AUC = 3/3 = 1
    assert res["prior_robust"] == pytest.approx(100 * (1 - 0.5 * (0 + 1)))
    assert res["perception_ability"] == pytest.approx(100.0)
    assert res["yes_rate"] == pytest.approx(100.0)
    # accuracy over the 10-instance protocol: 6 A right, 4 B wrong per scene
    assert res["accuracy"] == pytest.approx(60.0)
    assert payload["invalid"]["dobench"]["invalid_answer_rate"] == 0.0
    saved = json.loads((tmp_path / RESULTS).read_text())
    assert set(saved) >= {"results", "configs", "versions", "config"}


def test_unreadable_answers_are_wrong_and_counted(queries, tmp_path):
    payload = run(queries, CallableModel(lambda images, prompt: "hmm"), tmp_path, progress=False)
    assert payload["invalid"]["dobench"]["invalid_answer_rate"] == 100.0
    assert payload["results"]["dobench"]["accuracy"] == 0.0


def test_a_run_that_failed_before_its_first_answer_does_not_lock_its_folder(queries, tmp_path):
    """A setting that fails on the first batch (a misspelt generate() argument) leaves
    run.json and no answer: the corrected run into the same folder is taken, not refused
    as "answers from a different run"; once a folder holds answers, it is refused."""
    from evaluators.runner import RunMismatch

    def broken(images, prompt):
        raise TypeError("generate() got an unexpected keyword argument 'do_sampel'")

    with pytest.raises(TypeError):
        run(queries, CallableModel(broken, name="typo"), tmp_path, batch_size=5, progress=False)
    assert (tmp_path / "run.json").exists() and not read_samples(tmp_path / SAMPLES)
    fixed = run(queries, CallableModel(lambda i, p: "yes", name="fixed"), tmp_path, batch_size=5, progress=False)
    assert fixed["n_samples"]["dobench"] == len(queries)
    assert json.loads((tmp_path / "run.json").read_text())["model"]["model"] == "fixed"
    with pytest.raises(RunMismatch, match="different run"):
        run(queries, CallableModel(lambda i, p: "no", name="other"), tmp_path, batch_size=5, progress=False)


def test_a_folder_another_run_is_writing_is_refused_and_freed_when_it_dies(queries, tmp_path, held_elsewhere):
    """Two runs started together into one empty folder would both take it (the takeover of
    an answer-less folder cannot tell a crashed run from one warming up) and mix their
    answers: the second is refused at once, naming the holder; a killed holder frees it."""
    from evaluators.folder_lock import FolderBusy

    holder = held_elsewhere(tmp_path)
    with pytest.raises(FolderBusy, match=rf"being written by another run \(pid {holder.pid} on "):
        run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)
    assert not (tmp_path / "run.json").exists() and not read_samples(tmp_path / SAMPLES)
    holder.kill()  # a kill, not a clean exit: the operating system releases the lock
    holder.wait()
    payload = run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)
    assert payload["n_samples"]["dobench"] == len(queries)
    # the lock is the run's only while it runs: the next run (here, a resume) takes it again
    assert run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)["results"] == payload["results"]


def test_a_filesystem_that_cannot_lock_gets_a_warning_not_a_crash(queries, tmp_path, monkeypatch):
    """Lustre mounted without -o flock answers ENOSYS: the run died with an OSError; it now
    warns that it runs unlocked (a review)."""
    import errno

    from evaluators import folder_lock

    if not folder_lock.AVAILABLE:
        pytest.skip("no flock on this platform")

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(folder_lock.fcntl, "flock", no_flock)
    with pytest.warns(UserWarning, match="cannot lock files .*Function not implemented"):
        payload = run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)
    assert payload["n_samples"]["dobench"] == len(queries)


def test_killed_run_resumes_without_loss_or_duplicates(queries, tmp_path):
    calls = {"n": 0}

    def flaky(images, prompt):
        calls["n"] += 1
        if calls["n"] == 13:
            raise KeyboardInterrupt  # killed mid-run
        return "no" if "certain" in prompt else "yes"

    with pytest.raises(KeyboardInterrupt):
        run(queries, CallableModel(flaky), tmp_path, batch_size=5, progress=False)
    partial = read_samples(tmp_path / SAMPLES)
    assert 0 < len(partial) < len(queries)
    with (tmp_path / SAMPLES).open("a") as f:
        f.write('{"id": "torn')  # a line cut by the kill
    resumed = run(queries, CallableModel(flaky), tmp_path, batch_size=5, progress=False)
    ids = [r["id"] for r in read_samples(tmp_path / SAMPLES)]
    assert sorted(ids) == sorted(q.id for q in queries), "nothing lost, nothing duplicated"
    fresh = run(queries, CallableModel(lambda i, p: "no" if "certain" in p else "yes"), tmp_path / "fresh",
                progress=False)
    assert resumed["results"] == fresh["results"]


def test_missing_images_are_invalid_inputs_not_dropped(queries, tmp_path):
    broken = list(queries)
    broken[0].problem = "missing image x.png"
    payload = run(broken, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)
    assert payload["invalid"]["dobench"]["invalid_inputs"] == 1
    assert payload["n_samples"]["dobench"] == len(queries)
    broken[0].problem = None


def test_a_kill_between_a_records_brace_and_its_newline_loses_nothing(queries, tmp_path):
    """The last line is a whole record without its newline: it was read as done, so the
    resume must keep it (cutting it lost the answer and failed the merge)."""
    answer = lambda images, prompt: "no" if "certain" in prompt else "yes"
    run(queries[:5], CallableModel(answer), tmp_path, progress=False)
    path = tmp_path / SAMPLES
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # the newline the kill cut
    resumed = run(queries, CallableModel(answer), tmp_path, progress=False)
    assert sorted(r["id"] for r in read_samples(path)) == sorted(q.id for q in queries)
    assert resumed["results"] == run(queries, CallableModel(answer), tmp_path / "fresh", progress=False)["results"]


@pytest.mark.parametrize("flags, message", [
    (["--limit", "0"], "--limit must be a positive"),
    (["--limit", "-3"], "--limit must be a positive"),
    (["--mitigations", "crop_verify;prior_suppression"], "separated by ','"),
    (["--mitigations", "vcd:alfa=1"], "vcd has no argument"),
    (["--mitigations", "vcd:alpha=-1"], "alpha must be"),
    (["--gen_kwargs", "do_sample"], "--gen_kwargs takes key=value"),
    (["--model_args", "dtype"], "--model_args takes key=value"),
    (["--data", "my/do.jsonl"], "--data takes benchmark=path[,benchmark=path], got 'my/do.jsonl'"),
    (["--mitigations", "vcd:alpha"], "--mitigations: vcd: expected key=value, got 'alpha'"),
])
def test_cli_usage_errors_are_messages_not_tracebacks(tmp_path, capsys, flags, message):
    """A bad --mitigations / --gen_kwargs / --model_args value is a usage error (exit 2, the
    message on stderr), named before the model loads where it can be; it was a traceback."""
    from evaluators.cli import main
    from evaluators.organism import ORGANISM_DIR

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "organism", "--tasks", "dobench", "--limit", "2", "--output_path", str(tmp_path / "x"),
              "--no_progress", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_cli_end_to_end_on_the_organism(tmp_path, capsys):
    from evaluators.cli import main
    from evaluators.organism import ORGANISM_DIR

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    out = tmp_path / "run"
    assert main(["--model", "organism", "--tasks", "dobench", "--limit", "20", "--batch_size", "10",
                 "--output_path", str(out), "--no_progress"]) == 0
    payload = json.loads((out / RESULTS).read_text())
    assert payload["n_samples"]["dobench"] == 20
    assert 0.0 <= payload["results"]["dobench"]["accuracy"] <= 100.0
    assert payload["config"]["tasks"] == ["dobench"] and payload["config"]["data"] == {}
    # each record says what was asked and what was right, to check an answer by hand
    assert all(r["prompt"].endswith("answer yes or no .") and r["truth"] in ("yes", "no")
               for r in read_samples(out / SAMPLES))
    # with a mitigation, into another folder; then a rerun resumes (answers nothing new)
    args = ["--model", "organism", "--tasks", "dobench", "--limit", "20", "--mitigations", "vcd:alpha=1;beta=0.1",
            "--output_path", str(tmp_path / "vcd"), "--no_progress"]
    assert main(args) == 0
    before = (tmp_path / "vcd" / SAMPLES).read_text()
    assert main(args) == 0
    assert (tmp_path / "vcd" / SAMPLES).read_text() == before
    # another mitigation setting into that folder would mix two runs' answers: refused
    other = [a if a != "vcd:alpha=1;beta=0.1" else "vcd:alpha=2;beta=0.1" for a in args]
    with pytest.raises(SystemExit) as refused:  # a usage error naming what changed, not a traceback
        main(other)
    assert refused.value.code == 2
    assert "different run (changed: model.mitigations;" in capsys.readouterr().err
    assert (tmp_path / "vcd" / SAMPLES).read_text() == before


def test_a_retrained_checkpoint_does_not_resume_another_models_answers(tmp_path):
    """Same path, same settings, new weights: the stale answers are not reused."""
    import torch

    from evaluators.model import HFModel
    from evaluators.organism import ORGANISM_DIR, load_organism

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = build(n_scenes=1, seed=3)[:4]
    run(queries, HFModel(model, processor, max_new_tokens=4, name="organism"), tmp_path, progress=False)
    identity = json.loads((tmp_path / "run.json").read_text())
    assert identity["weights"] and identity["model"]["model"] == "organism"
    original = model.lm_head.weight[-1, -1].item()
    with torch.no_grad():
        model.lm_head.weight[-1, -1] += 1.0  # the last value: the digest reads it
    with pytest.raises(ValueError, match="changed: weights"):
        run(queries, HFModel(model, processor, max_new_tokens=4, name="organism"), tmp_path, progress=False)
    with torch.no_grad():
        model.lm_head.weight[-1, -1] = original
    run(queries, HFModel(model, processor, max_new_tokens=4, name="organism"), tmp_path, progress=False)


def test_a_changed_prompt_format_does_not_resume_the_old_answers(tmp_path):
    """Same weights, another chat template or image-processor setting (a Hub repo's updated
    template, an edited preprocessor_config.json): the prompts differ, so the answers are
    not reused; the original processor resumes. A folder written before the processor was
    recorded resumes as before."""
    from evaluators.model import HFModel
    from evaluators.organism import ORGANISM_DIR, load_organism
    from evaluators.runner import RunMismatch

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    model, processor = load_organism()
    queries = build(n_scenes=1, seed=3)[:4]

    def ask():
        return run(queries, HFModel(model, processor, max_new_tokens=4, name="organism"), tmp_path, progress=False)

    ask()
    identity = json.loads((tmp_path / "run.json").read_text())
    identity_processor = identity["model"]["processor"]
    assert isinstance(identity_processor, str)
    template = processor.chat_template
    processor.chat_template = "SYSTEM: be brief . " + template
    with pytest.raises(RunMismatch, match="changed: model.processor"):
        ask()
    processor.chat_template = template
    resample = processor.image_processor.resample
    processor.image_processor.resample = 0 if resample else 2
    with pytest.raises(RunMismatch, match="changed: model.processor"):
        ask()
    processor.image_processor.resample = resample
    ask()
    del identity["model"]["processor"]  # as written before the processor was recorded
    (tmp_path / "run.json").write_text(json.dumps(identity, indent=2) + "\n")
    ask()  # resumes, and records the processor from now on
    assert json.loads((tmp_path / "run.json").read_text())["model"]["processor"] == identity_processor
    processor.chat_template = "SYSTEM: be brief . " + template
    try:
        with pytest.raises(RunMismatch, match="changed: model.processor"):
            ask()
    finally:
        processor.chat_template = template


def test_prior_suppressions_chat_template_and_span_texts_are_part_of_a_runs_identity():
    """Left out of the repr (long), they change which tokens are suppressed: the recorded
    identity carries their digests, and is the plain repr when they are not given."""
    from evaluators.model import stable_repr
    from mitigate import PriorSuppression

    from evaluators.organism import load_organism

    tok = load_organism()[1].tokenizer
    plain = PriorSuppression(tok)
    assert stable_repr(plain) == repr(plain)
    a, b = PriorSuppression(tok, chat_template="{{ messages }}"), PriorSuppression(tok, chat_template="{{ messages }} ")
    assert repr(a) == repr(b) and stable_repr(a) != stable_repr(b)
    assert "chat_template=<sha256 " in stable_repr(a) and stable_repr(a).endswith(")")
    spans = [[(0, 2)]]
    one = PriorSuppression(tok, spans=spans, span_texts=["ab c"])
    assert stable_repr(one) != stable_repr(PriorSuppression(tok, spans=spans, span_texts=["xy c"]))


@pytest.mark.parametrize("task, limit", [("dobench", 10), ("mioh", 12), ("causal_halbench", 8),
                                         ("hallusegbench", 12), ("reactbench", 12)])
def test_every_suite_end_to_end_on_the_organism(tmp_path, task, limit):
    """vlm-eval on each built-in suite with --limit: every registered metric computed (or
    said why not), invalid rates reported, the paper's breakdowns in results.json."""
    from evaluators.cli import main
    from evaluators.metrics import metrics_for
    from evaluators.organism import ORGANISM_DIR

    if not (ORGANISM_DIR / "config.json").exists():
        pytest.skip("organism checkpoint missing")
    out = tmp_path / task
    assert main(["--model", "organism", "--tasks", task, "--limit", str(limit), "--output_path", str(out),
                 "--no_progress"]) == 0
    payload = json.loads((out / RESULTS).read_text())
    from evaluators.benchmarks.suites import build_suite
    from evaluators.query import first_units

    assert payload["n_samples"][task] == len(first_units(build_suite(task, 0, "full"), limit)) >= limit
    assert set(payload["invalid"][task]) == {"invalid_answer_rate", "invalid_inputs"}
    results = payload["results"][task]
    names = {spec.name.split(".", 1)[1] for spec in metrics_for(task)}
    skipped = {n.split(".", 1)[1] for n in results.get("_not_computed", {})}
    assert names <= set(results) | skipped
    assert any(isinstance(results.get(n), float) for n in names), "at least one metric has a value"
    extra = {"dobench": "details", "mioh": "details", "reactbench": "details", "hallusegbench": "by_split"}
    if task in extra:
        assert extra[task] in results


def test_mioh_suite_and_a_scripted_none_of_the_above(tmp_path):
    from evaluators.benchmarks.mioh.suite import build as mioh

    queries = mioh(n_per_condition=4, seed=2)
    decomposed = [q for q in queries if "decomposed_of" in q.record]
    assert len(decomposed) == 4 * (2 + 4 + 8 + 10), "one yes/no per image of every NI question"
    for qtype in ("selective", "comprehensive"):  # every image set is asked both
        conditions = [q.record["condition"] for q in queries if "decomposed_of" not in q.record
                      and q.record["qtype"] == qtype]
        assert {c: conditions.count(c) for c in set(conditions)} == {
            "easy": 4, "HP": 4, "HN": 4, "NI": 16, "LC-S": 4, "LC-I": 4}
    assert sorted({q.record["n_images"] for q in queries if q.record["condition"] == "NI"}) == [2, 4, 8, 10]
    assert all(len(q.images) == q.record["n_images"] for q in queries if "decomposed_of" not in q.record)
    siblings = {q.id: q for q in queries}
    for q in queries:  # the comprehensive question is about the selective one's images
        if q.record["qtype"] == "comprehensive":
            selective = siblings[q.id.removesuffix("-comprehensive")]
            assert q.images == selective.images and q.kind == "yes_no"
            assert q.truth == ("no" if selective.truth == OPTION_LETTERS[len(selective.options) - 1] else "yes")
    # "none of the above" (and "no" image by image) is right exactly where the target is
    # absent: 1 in 4 easy and HN (k = 3), 1 in 4 NI per image count, half of LC-S / LC-I
    # (before session 32 every HN set lacked its target, and this policy scored HN 100)
    scripted = CallableModel(lambda images, prompt: "no" if "yes or no" in prompt else "none of the above")
    payload = run(queries, scripted, tmp_path, progress=False)
    res = payload["results"]["mioh"]
    assert res["hn"] == pytest.approx(25.0)
    assert res["easy"] == pytest.approx(25.0)
    assert res["ni"] == pytest.approx(25.0)
    assert res["lc_s"] == pytest.approx(50.0) and res["lc_i"] == pytest.approx(50.0)
    assert res["hp"] == pytest.approx(0.0)
    assert res["ni_decomposed"] == pytest.approx(25.0) and res["decomposition_gap"] == pytest.approx(0.0)
    # "no" is the right comprehensive answer, and the right combination image by image,
    # where the target is absent: the same shares question type by question type
    table = res["details"]["by_task_qtype_condition"]["existence"]
    assert table["comprehensive"] == table["selective"]
    assert res["details"]["decomposition"]["comprehensive"] == {"direct": 25.0, "decomposed": 25.0, "gap": 0.0, "n": 16}
    # a model that finds the target in every set, all at once, but in no image alone:
    # Sec. 5.5's gap is negative for the comprehensive question
    finder = CallableModel(lambda images, prompt: "no" if len(images) == 1 else "yes")
    res = run(queries, finder, tmp_path / "finder", progress=False)["results"]["mioh"]
    comprehensive = res["details"]["decomposition"]["comprehensive"]
    assert comprehensive == {"direct": 75.0, "decomposed": 25.0, "gap": -50.0, "n": 16}


def test_mioh_decomposition_reads_only_the_images_the_selective_question_lists():
    """At 8 and 10 images the selective question lists four; a "yes" on an image it does
    not list cannot be its answer, so the decomposed answer ignores it (§5.5 compares the
    same question asked two ways). Before session 32 it made the decomposed answer wrong."""
    from evaluators.benchmarks.mioh.suite import assemble
    from evaluators.benchmarks.mioh.suite import build as mioh

    queries = mioh(n_per_condition=1, seed=0)
    per_image = [q for q in queries if "decomposed_of" in q.record and q.record["n_images"] == 10]
    record = per_image[0].record
    listed, holder = record["listed"], record["holder"]
    assert len(listed) == 4 and (holder is None or holder in listed)
    stray = next(i for i in range(10) if i not in listed)
    rows = [{**q.record, "benchmark": "mioh", "pred_yes": q.record["image_index"] in ({holder, stray} - {None})}
            for q in per_image]
    selective = next(r for r in assemble(rows) if r["id"].endswith("-decomposed") and r["qtype"] == "selective")
    assert selective["correct"] and selective["combined"] == ("none" if holder is None else holder)
    comprehensive = next(r for r in assemble(rows) if r["qtype"] == "comprehensive")
    assert comprehensive["combined"] in ("some", "all")  # the comprehensive question asks about every image


def test_mioh_a_set_with_an_unreadable_image_is_left_out_of_both_forms():
    """A direct question whose image cannot be read leaves the denominator; its decomposed
    form had counted the same image's missing answer as wrong, biasing §5.5's gap."""
    from evaluators.benchmarks.mioh.suite import assemble
    from evaluators.benchmarks.mioh.suite import build as mioh

    queries = mioh(n_per_condition=1, seed=0)
    per_image = [q for q in queries if "decomposed_of" in q.record and q.record["n_images"] == 4]
    of = per_image[0].record["decomposed_of"]
    rows = [{**q.record, "benchmark": "mioh", "pred_yes": False} for q in per_image if q.record["decomposed_of"] == of]
    assert len(rows) == 4 and sum(r["id"].startswith(of) for r in assemble(rows)) == 2  # both forms scored
    rows[1] = {**rows[1], "invalid_input": True, "pred_yes": None}
    assert not [r for r in assemble(rows) if r.get("decomposed")]


def test_mioh_selective_only_suite_pairs_decomposition_with_the_selective_questions(tmp_path):
    """Without the comprehensive questions the suite's selective questions are the same, and
    the decomposed comprehensive records have no direct question to be compared with: the
    gap pools the selective ones only."""
    from evaluators.benchmarks.mioh.suite import build as mioh

    both, selective = mioh(n_per_condition=2, seed=5), mioh(n_per_condition=2, seed=5, comprehensive=False)
    assert [(q.id, q.prompt, q.truth) for q in both if q.record["qtype"] == "selective"] == [
        (q.id, q.prompt, q.truth) for q in selective]
    import numpy as np

    assert all(len(a.images) == len(b.images) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                                      for x, y in zip(a.images, b.images))
               for a, b in zip([q for q in both if q.record["qtype"] == "selective"], selective))
    finder = CallableModel(lambda images, prompt: "no" if len(images) == 1 else "yes")
    res = run(selective, finder, tmp_path, progress=False)["results"]["mioh"]
    assert set(res["details"]["decomposition"]) == {"selective"}
    assert res["ni_decomposed"] == res["details"]["decomposition"]["selective"]["decomposed"]
    with pytest.raises(ValueError, match="comprehensive"):
        mioh(n_per_condition=1, comprehensive="yes")


def test_causal_halbench_suite_with_a_scripted_yes(tmp_path):
    from evaluators.benchmarks.causal_halbench.suite import build as causal

    queries = causal(n_pairs=5, seed=3)
    assert len(queries) == 45  # per pair: 3 QA (Q_c, two Q_a) + a caption on X, 4 QA (+ Q_cf) + a caption on X_cf
    res = run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)["results"]["causal_halbench"]
    # right: Q_c on X and X_cf, Q_cf on X_cf (15 of 35); wrong: the four Q_a
    assert res["accuracy"] == pytest.approx(300 / 7)
    assert res["chr"] == pytest.approx(0.0) and res["cac"] == pytest.approx(0.0) and res["aac"] == pytest.approx(0.0)
    # one contextual pair (both right) and two absent pairs (both wrong) per base scene; the
    # absent pairs pair by question, not with each other's
    assert res["cpr"] == pytest.approx(100 / 3)
    # the caption "yes" mentions no object: nothing hallucinated
    assert res["chair_s"] == pytest.approx(0.0)
    mentions = CallableModel(lambda i, p: "a dog , a fork ." if "describe" in p else "yes")
    res = run(queries, mentions, tmp_path / "m", progress=False)["results"]["causal_halbench"]
    assert 0.0 < res["chair_s"] <= 100.0


def test_hallusegbench_suite_assembles_pairs(tmp_path):
    import numpy as np

    from evaluators.benchmarks.hallusegbench.suite import build as hsb
    from evaluators.world import Scene

    queries = hsb(n_pairs=3, seed=4)
    assert [q.record["role"] for q in queries[:3]] == ["fact", "textual", "visual"]
    whole = "<c0> <c0> <c15> <c15>"  # a box covering the image, for every query
    res = run(queries, CallableModel(lambda i, p: whole), tmp_path, progress=False)["results"]["hallusegbench"]
    ious = []
    for q in queries[::3]:
        mask = Scene.from_dict(q.record["factual_scene"]).masks()[q.record["uid"]]
        ious.append(mask.sum() / mask.size)  # IoU of the whole image with the object mask
    assert res["iou_fact"] == pytest.approx(float(np.mean(ious)))
    # the same whole-image box everywhere: no drop for the swapped label
    assert res["delta_iou_textual"] == pytest.approx(0.0)
    assert run(queries, CallableModel(lambda i, p: "none"), tmp_path / "abstain",
               progress=False)["results"]["hallusegbench"]["iou_fact"] == 0.0


def test_hallusegbench_unreadable_answers_are_wrong_not_abstentions(tmp_path):
    """An answer no mask can be read from is the empty mask on the factual query (IoU 0)
    and, where abstaining is right, full leakage (IoU 1) and an unreadable one in its share
    -- never a free abstention; CMS reads readable answers only. An explicit "none" stays
    an abstention."""
    from evaluators.benchmarks.hallusegbench.suite import build as hsb

    queries = hsb(n_pairs=3, seed=4)
    gibberish = run(queries, CallableModel(lambda i, p: "I cannot determine that"), tmp_path / "g",
                    progress=False)["results"]["hallusegbench"]
    abstain = run(queries, CallableModel(lambda i, p: "none"), tmp_path / "n", progress=False)["results"]["hallusegbench"]
    assert abstain["iou_textual"] == abstain["iou_visual"] == abstain["cms_fact"] == 0.0
    assert abstain["unreadable_textual"] == abstain["unreadable_visual"] == 0.0
    assert gibberish["iou_fact"] == 0.0
    assert gibberish["iou_textual"] == gibberish["iou_visual"] == 1.0
    assert gibberish["delta_iou_textual"] == gibberish["delta_iou_visual"] == -1.0
    assert gibberish["unreadable_textual"] == gibberish["unreadable_visual"] == 1.0
    assert math.isnan(gibberish["cms_fact"]) and math.isnan(gibberish["cms_counterfact"])


def test_hallusegbench_visual_answers_are_drawn_on_the_counterfactual_images_grid(tmp_path):
    """User data whose I' is larger than I: a box answered on I' is rasterised at I''s size,
    so a box on the replaced object's exact region scores IoU 1 against M'_{c'}."""
    import numpy as np
    from PIL import Image

    from evaluators.benchmarks.hallusegbench.suite import assemble

    fact, counter = np.zeros((100, 100), bool), np.zeros((200, 200), bool)
    fact[20:60, 20:60] = True
    counter[40:120, 40:120] = True
    paths = {}
    for name, mask in (("fact", fact), ("counter", counter)):
        paths[name] = str(tmp_path / f"{name}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(paths[name])
    common = {"sample_id": "s", "split": "referring", "factual_mask_path": paths["fact"],
              "counterfactual_mask_path": paths["counter"]}
    answers = {"fact": "[20, 20, 60, 60]", "textual": "none", "visual": "[40, 40, 120, 120]"}
    [record] = assemble([{**common, "role": role, "answer": a} for role, a in answers.items()])
    assert record["pred_visual"].shape == (200, 200) and not record["invalid"]
    from evaluators.benchmarks.hallusegbench.metrics import sample_scores

    scores = sample_scores(record["gt_fact"], record["gt_counterfact"], record["pred_fact"],
                           record["pred_textual"], record["pred_visual"])
    assert scores["iou_fact"] == 1.0 and scores["iou_visual"] == 1.0 and scores["cms_counterfact"] == 1.0


def test_reactbench_suite_with_a_scripted_yes(tmp_path):
    import re

    from evaluators.benchmarks.reactbench.suite import build as react
    from evaluators.organism.tasks import vocabulary

    direct = react(n_per_task=4, seed=5, dimensions=("direct",), hints=("none",))
    assert len(direct) == 48  # 4 tasks x 3 question types x 4
    vocab = set(vocabulary())
    for q in direct:  # the direct, no-hint questions speak the organism's vocabulary
        assert set(re.findall(r"<c\d+>|\w+|[^\w\s]", q.prompt)) <= vocab, q.prompt
    queries = react(n_per_task=4, seed=5)
    # + commonsense YN, premise YN+SA, absurd MC (erasure); commonsense, premise, absurd (attribute);
    # location and operation hints (tracing)
    assert len(queries) == 48 + 4 * 4 + 4 * 3 + 4 * 2
    assert [q.id for q in queries if q.id in {d.id for d in direct}] == [d.id for d in direct], "direct ids kept"
    assert {q.prompt for q in direct} <= {q.prompt for q in queries}
    res = run(queries, CallableModel(lambda i, p: "yes"), tmp_path, progress=False)["results"]["reactbench"]
    # "yes" is only a right answer to yes/no questions whose truth is yes: in alteration
    # tracing those about the change made, in the attribute task the direct ones about the
    # drawn colour (about half of each, by design: S = 0.25 * their share), in erasure none
    for task in ("alteration_tracing", "counterfactual_attribute"):
        yn = [q.truth for q in queries if q.record["task"] == task and q.record["qtype"] == "YN"]
        assert 0 < yn.count("yes") < len(yn)
        assert res[task] == pytest.approx(25.0 * yn.count("yes") / len(yn))
    assert res["relational_erasure"] == pytest.approx(0.0)


def test_reactbench_every_dimension_and_hint_has_consistent_truths(tmp_path):
    """An oracle that answers each query with its ground truth scores 100 in every
    breakdown cell of Table 4 and in both modes: the templates, options and truths agree."""
    from evaluators.benchmarks.reactbench.suite import build as react

    queries = react(n_per_task=4, seed=7, modes=("standard", "cot"))
    truth = {}
    for q in queries:
        if q.kind == "keywords":
            answer = " ".join(q.truth)
        elif q.kind == "yes_no":
            answer = q.truth
        else:
            answer = str(q.truth)
        truth[(q.prompt, b"".join(img.tobytes() for img in q.images))] = answer
    oracle = CallableModel(lambda images, prompt: truth[(prompt, b"".join(i.tobytes() for i in images))])
    res = run(queries, oracle, tmp_path, progress=False)["results"]["reactbench"]
    assert res["react_score"] == pytest.approx(100.0)
    for task, cells in res["details"]["breakdown"].items():
        for value, acc in cells.items():
            assert acc == pytest.approx(100.0), (task, value)
    assert all(v == pytest.approx(100.0) for modes in res["details"]["accuracy_by_mode"].values() for v in modes.values())
    cot = [q for q in queries if q.record["mode"] == "cot"]
    assert len(cot) == len(queries) // 2 and all(q.prompt.endswith("final answer .") for q in cot)
    with pytest.raises(ValueError, match="dimensions"):
        react(n_per_task=1, dimensions=("sarcastic",))


def test_changed_fields_name_the_leaf_that_changed():
    from evaluators.runner import changed_fields

    old = {"model": {"model": "m", "mitigations": ["VCD(alpha=1)"], "generate_kwargs": {"do_sample": False}},
           "weights": "ab", "seed": 0}
    new = {"model": {"model": "m", "mitigations": ["VCD(alpha=2)"], "generate_kwargs": {"do_sample": True}},
           "weights": "ab", "seed": 1}
    assert changed_fields(old, new) == ["model.generate_kwargs.do_sample", "model.mitigations", "seed"]
    assert changed_fields(old, {**old, "weights": None}) == ["weights"]
    assert changed_fields(old, old) == []


def test_a_killed_and_resumed_sampled_run_answers_as_an_uninterrupted_one(queries, tmp_path):
    """A model whose answers draw on torch's random stream (as sampling does): the resumed
    run's batches and seeds are the uninterrupted run's, so every answer is the same."""
    import torch

    def sampler(kill_at=None):
        calls = {"n": 0}

        def answer(images, prompt):
            calls["n"] += 1
            if calls["n"] == kill_at:
                raise KeyboardInterrupt
            return "yes" if float(torch.rand(())) < 0.5 else "no"
        return CallableModel(answer)

    straight = tmp_path / "straight"
    run(queries, sampler(), straight, batch_size=4, progress=False)
    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run(queries, sampler(kill_at=11), resumed, batch_size=4, progress=False)
    run(queries, sampler(), resumed, batch_size=4, progress=False)
    answers = [{r["id"]: r["answer"] for r in read_samples(folder / SAMPLES)} for folder in (straight, resumed)]
    assert answers[0] == answers[1]


def test_flag_values_read_pythons_literals():
    """``generic_prompt=none`` reached CropVerify as the string "none" (a one-word generic
    prompt), not as "no generic prompt"; JSON's spellings and Python's now mean the same."""
    from evaluators.cli import parse_kv

    assert parse_kv("a=none,b=None,c=null,d=True,e=false,f=text,g=0.5") == {
        "a": None, "b": None, "c": None, "d": True, "e": False, "f": "text", "g": 0.5}
    with pytest.raises(ValueError, match="given twice"):
        parse_kv("alpha=1,alpha=2")


def test_stored_answers_are_graded_again_by_todays_parsers(queries, tmp_path):
    """A folder's lines keep the grade of the code that wrote them; a rerun (nothing left to
    answer) scores every line by the current parsers, as a report over finished folders does.
    Here an older parser is played by rewriting 'parsed' / 'correct' / 'invalid' of every line."""
    fresh = run(queries, CallableModel(lambda images, prompt: "Yes."), tmp_path, progress=False)
    path = tmp_path / SAMPLES
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "parsed": None, "pred_yes": None, "correct": False, "invalid": True})
                            + "\n" for r in lines))
    rerun = run(queries, CallableModel(lambda images, prompt: pytest.fail("nothing is asked again")), tmp_path,
                progress=False)
    assert rerun["results"] == fresh["results"] and rerun["invalid"] == fresh["invalid"]


def _flags(folder):
    return {r["id"]: r["invalid"] for r in read_samples(folder / SAMPLES) if not r.get("invalid_input")}


def test_per_sample_invalid_flags_are_what_the_invalid_answer_rate_counts(tmp_path):
    """samples.jsonl flagged no HalluSegBench answer invalid ("<c7> <c0>", half a box, is text)
    while the pairs' metrics read it as unreadable and the run printed a rate over pairs;
    MIOH's rate counted its decomposed sets that named several images, which no sample
    flags. The flag is now the metrics' reading of each answer, and the rate counts flags."""
    import itertools

    from evaluators.benchmarks.hallusegbench.suite import build as hsb
    from evaluators.benchmarks.mioh.suite import build as mioh
    from evaluators.runner import metric_records

    answers = itertools.cycle(["<c7> <c0>", "<c1> <c1> <c5> <c5>", "none", "I cannot tell", "[1, 1, 9, 9]"])
    queries = hsb(n_pairs=3, seed=4)
    payload = run(queries, CallableModel(lambda i, p: next(answers)), tmp_path / "h", batch_size=4, progress=False)
    flags = _flags(tmp_path / "h")
    assert sum(flags.values()) == 7  # the half boxes and the sentences among 18 answers
    assert payload["invalid"]["hallusegbench"]["invalid_answer_rate"] == pytest.approx(100 * 7 / 18)
    rows = read_samples(tmp_path / "h" / SAMPLES)
    for pair in metric_records("hallusegbench", rows):  # the roles the metrics score as unreadable
        assert set(pair["unreadable"]) == {r["role"] for r in rows if r["sample_id"] == pair["id"] and r["invalid"]}

    sets = mioh(n_per_condition=1, seed=0)  # "yes" on every image of an NI set: its decomposition names no one image
    payload = run(sets, CallableModel(lambda i, p: "a" if "in which image" in p else "yes"), tmp_path / "m",
                  progress=False)
    assert not any(_flags(tmp_path / "m").values())
    assert payload["invalid"]["mioh"]["invalid_answer_rate"] == 0.0


def test_a_folder_flagged_by_older_rules_is_brought_up_to_date(tmp_path):
    """A rerun grades every stored answer by today's rules: samples.jsonl is rewritten with
    the flags the rate counts (a resumed folder had kept the old ones)."""
    from evaluators.benchmarks.hallusegbench.suite import build as hsb

    queries = hsb(n_pairs=1, seed=4, splits=("referring",))
    model = CallableModel(lambda i, p: "<c7> <c0>")
    run(queries, model, tmp_path, progress=False)
    path = tmp_path / SAMPLES
    old = [{**r, "invalid": False} for r in read_samples(path)]  # as to_record's parse alone had said
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    payload = run(queries, model, tmp_path, progress=False)
    assert all(_flags(tmp_path).values()) and len(_flags(tmp_path)) == 3
    assert payload["invalid"]["hallusegbench"]["invalid_answer_rate"] == 100.0


def test_the_console_line_says_how_many_inputs_were_invalid(queries, tmp_path):
    """A missing image left the console at "invalid answers 0.0%" with n counting it; only
    results.json said ``invalid_inputs``."""
    from evaluators.runner import summary_line

    three = queries[:3]
    try:
        three[0].problem = "missing image x.png"
        payload = run(three, CallableModel(lambda i, p: "yes"), tmp_path / "one", progress=False)
        assert summary_line("dobench", payload).endswith("(n=3, invalid answers 0.0%, 1 input invalid)")
        three[1].problem = "corrupt image y.png"
        payload = run(three, CallableModel(lambda i, p: "yes"), tmp_path / "two", progress=False)
        assert summary_line("dobench", payload).endswith("(n=3, invalid answers 0.0%, 2 inputs invalid)")
    finally:
        three[0].problem = three[1].problem = None
    payload = run(three, CallableModel(lambda i, p: "yes"), tmp_path / "none", progress=False)
    line = summary_line("dobench", payload)
    assert line.startswith("dobench: ") and line.endswith("(n=3, invalid answers 0.0%)")


# -- what a run resumes on ------------------------------------------------------------------

def _say_yes(images, prompt):
    return "yes"


def _say_no(images, prompt):
    return "no"


def _detector_maker():
    def detector(image, name):
        return (0, 0, image.width // 2, image.height // 2)
    return detector


def _other_detector(image, name):
    return (0, 0, image.width, image.height)


def test_a_localizer_function_resumes_in_another_process(tmp_path):
    """CropVerify's ``localizer`` printed with its memory address ('<function f at 0x7f..>'),
    so the run identity differed in every process and no such run could resume. A new
    process's function is a new object at a new address: two closures stand in for it."""
    import torch

    from evaluators.model import HFModel
    from evaluators.runner import RunMismatch
    from mitigate import CropVerify

    class Tiny(torch.nn.Module):
        config = type("Config", (), {"_name_or_path": "tiny"})()

    class Answering(HFModel):
        def __call__(self, queries):
            return ["yes"] * len(queries)

    def model(localizer):
        return Answering(Tiny(), None, mitigations=[CropVerify(object(), localizer=localizer)])

    first, second = _detector_maker(), _detector_maker()
    assert repr(first) != repr(second)  # the addresses differ
    described = model(first).describe()["mitigations"][0]
    assert "0x" not in described and f"localizer=<function {__name__}._detector_maker.<locals>.detector>" in described
    queries = build(n_scenes=1, seed=5)[:3]
    run(queries, model(first), tmp_path, progress=False)
    run(queries, model(second), tmp_path, progress=False)  # the same function: resumes
    with pytest.raises(RunMismatch, match="model.mitigations"):
        run(queries, model(_other_detector), tmp_path, progress=False)


def test_another_callable_model_does_not_resume_its_answers(tmp_path):
    """CallableModel's identity was {"model": "callable"} for every function: a run with
    another function resumed into the first one's answers without a word."""
    from evaluators.runner import RunMismatch

    queries = build(n_scenes=1, seed=5)[:4]
    run(queries, CallableModel(_say_yes), tmp_path, progress=False)
    with pytest.raises(RunMismatch, match="model.fn"):
        run(queries, CallableModel(_say_no), tmp_path, progress=False)
    assert run(queries, CallableModel(_say_yes), tmp_path, progress=False)["results"]["dobench"]["yes_rate"] == 100.0
    assert CallableModel(_say_yes).describe()["fn"] == f"{__name__}._say_yes"
    # closures of one function look alike; a name tells them apart
    assert CallableModel(_detector_maker()).describe() == CallableModel(_detector_maker()).describe()
    assert CallableModel(_say_yes, name="a").describe() != CallableModel(_say_yes, name="b").describe()


def _user_dobench(folder):
    import json

    from PIL import Image

    rows = []
    for s in "AB":
        for lv in range(4):
            Image.new("RGB", (24, 24), (50 * lv, 90, 10)).save(folder / f"{s}{lv}.png")
            rows.append({"id": f"{s}{lv}", "scene_id": "s", "image": f"{s}{lv}.png", "series": s, "level": lv,
                         "view": "Full", "object": "cat", "answer": "yes" if s == "A" else "no",
                         "question": "is there a cat in the image ? answer yes or no ."})
    (folder / "do.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "do.jsonl"


@pytest.mark.parametrize("world", [1, 2])
def test_a_restored_image_is_asked_on_the_rerun(tmp_path, world):
    """A missing image is an invalid input; once the user restores it, a rerun asks it and
    the answer replaces the invalid input's record -- in one process, and when the rerun
    runs on two (the answer then comes from a rank file, the old record from samples.jsonl)."""
    from evaluators.benchmarks.protocols import dobench
    from evaluators.distributed import Ranks

    data = _user_dobench(tmp_path)
    image = tmp_path / "A2.png"
    saved = image.read_bytes()
    image.unlink()
    asked = []

    def model(images, prompt):
        asked.append(prompt)
        return "yes"

    out = tmp_path / "run"
    first = run(dobench(data), CallableModel(model), out, progress=False, ranks=Ranks())
    assert first["invalid"]["dobench"]["invalid_inputs"] == 1 and len(asked) == 7
    again = run(dobench(data), CallableModel(model), out, progress=False, ranks=Ranks())  # still missing
    assert again["invalid"]["dobench"]["invalid_inputs"] == 1 and len(asked) == 7
    assert [r["id"] for r in read_samples(out / SAMPLES)].count("do-A2") == 1
    image.write_bytes(saved)  # restored
    queries = dobench(data)
    for rank in reversed(range(world)):  # the main rank last: it merges
        payload = run(queries, CallableModel(model), out, progress=False, ranks=Ranks(rank, world))
    assert len(asked) == 8  # the restored one, and only it
    assert payload["invalid"]["dobench"]["invalid_inputs"] == 0
    records = [r for r in read_samples(out / SAMPLES) if r["id"] == "do-A2"]
    assert len(records) == 1 and records[0]["answer"] == "yes" and not records[0].get("invalid_input")
    assert not list(out.glob("samples.rank*.jsonl"))
