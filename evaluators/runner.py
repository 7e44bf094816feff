"""Run queries against a model: batched, seeded, resumable, one JSON line per answer.

``run(queries, model, output_dir)`` appends one line per answered query to
``output_dir/samples.jsonl`` and flushes it as it goes; a rerun reads the file first and
skips every query id already there, so a killed run resumes with nothing lost and nothing
duplicated. Queries whose images are missing or corrupt are written as invalid inputs
(counted, never silently dropped); a rerun asks them once their images can be read (the
user restored them), and the answer replaces the invalid input's line. The scores are
then computed from the file -- so they never depend on how many runs it took -- and
written to ``results.json`` with the config (model, mitigations, seeds, versions) and
per-benchmark invalid rates, in the layout lmms-eval users know (``results``,
``configs``, ``versions``, ``config``).

Under ``accelerate launch`` / ``torchrun`` every process runs the same ``run(...)``: each
answers its own shard of the queries (:mod:`evaluators.distributed`) into its own file,
and the main process merges the files and scores (:mod:`evaluators.shards`). Greedy
results do not depend on the number of processes or the batch size; sampled ones are
reproducible for a given process count and batch size (the seed is set per batch).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import folder_lock, shards
from .distributed import Ranks
from .query import Query, fingerprint, image_digests, image_files, regrade, repeated_ids, to_record
from .shards import SAMPLES, read_samples

RESULTS = "results.json"
#: What produced the answers in an output folder; a rerun must match it to resume there.
RUN_IDENTITY = "run.json"
__all__ = ["RESULTS", "RUN_IDENTITY", "SAMPLES", "flag_invalid", "metric_records", "read_samples", "run", "run_identity",
           "score", "summary_line", "versions"]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def versions() -> dict[str, str]:
    import numpy
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": numpy.__version__}


def run(
    queries: Sequence[Query],
    model: Callable[[Sequence[Query]], list[str]],
    output_dir: str | Path,
    *,
    batch_size: int = 8,
    seed: int = 0,
    config: dict | None = None,
    progress: bool = True,
    ranks: Ranks | None = None,
    judge=None,
    judge_batch_size: int | None = None,
) -> dict | None:
    """Answer every query not yet answered in ``output_dir``; score; write results.json.

    ``ranks``: this process's place in a multi-process run; by default read from the
    launcher's environment (:func:`evaluators.distributed.init`). Every process calls
    ``run`` with the same queries; the main process returns the payload, the others None.

    ``judge``: an LLM judge (:mod:`evaluators.judge`, e.g. :class:`evaluators.judge.HFJudge`)
    that grades the answers of the benchmarks whose paper grades with one (ReactBench), on
    the main process after every answer is in, ``judge_batch_size`` at a time (None: the
    judge's own ``batch_size``); without one every answer is graded by rule, also where an
    earlier run in ``output_dir`` had a judge; the rule's
    grade stays in each record (``rule_correct``) and ``payload["judge"]`` says what it
    judged, how many replies held no verdict and how often it agreed with the rules.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if judge is not None:
        from .judge import check_judge

        check_judge(judge)
    ids = [q.id for q in queries]
    if twice := repeated_ids(queries):
        raise ValueError(f"query ids must be unique; repeated: {twice[:3]}")
    if ranks is None:
        from .distributed import init

        ranks = init()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock.hold(out, take=ranks.is_main):  # one run at a time in a folder
        return _run_in(out, queries, ids, model, ranks, batch_size=batch_size, seed=seed, config=config,
                       progress=progress, judge=judge, judge_batch_size=judge_batch_size)


def _run_in(out: Path, queries: Sequence[Query], ids: list[str], model, ranks: Ranks, *, batch_size: int,
            seed: int, config: dict | None, progress: bool, judge, judge_batch_size: int | None) -> dict | None:
    """:func:`run` once it holds ``out``: resume or take the folder, answer, merge, score."""
    identity = run_identity(model, seed)
    recorded = _read_identity(out)
    stored = _not_recorded_then(recorded, identity)
    answered = shards.done_fingerprints(out)
    if stored is not None and stored != identity and not answered:
        stored = None  # a run that stopped before its first answer (a bad generate() argument,
        # say): nothing to mix with, so the folder is this run's and run.json is rewritten
    if stored is not None and stored != identity:
        changed = changed_fields(stored, identity)
        raise RunMismatch(
            f"output_dir {out} holds answers from a different run (changed: {', '.join(changed)}; "
            f"see {out / RUN_IDENTITY}); a run resumes only with the same model, weights, mitigations, "
            "generation settings and seed -- choose another output_dir or delete that one")
    mine = [q for q in queries if ranks.owns(q.id)]
    # each query as the model is asked it: a grounding query in the model's grounding format
    # (evaluators.grounding_formats) is another question under another wording
    asked = getattr(model, "asked", lambda q: q)
    prints = {q.id: fingerprint(asked(q)) for q in queries}
    # a record without a fingerprint was written before they were kept, by code whose record
    # fields (pairings, parsed answers) may since have been fixed: not resumed either
    other = [i for i in ids if i in answered and answered[i] != prints[i]]
    if other:  # e.g. another data file whose ids repeat these, or suites drawn differently
        old = sum(answered[i] is None for i in other)
        why = ("written before answers kept their query's fingerprint" if old == len(other) else
               "their prompt, images, truth or options differ: another data file under the same ids, a "
               "suite drawn by another version of the world, or boxes asked in another --grounding_format")
        raise RunMismatch(
            f"output_dir {out} holds answers to other questions under {len(other)} of these query ids "
            f"(e.g. {other[:3]}: {why}); a run resumes only on the same queries -- choose another output_dir "
            "or delete that one")
    # an input that could not be asked (a missing image) is not done: once it can be read
    # (restored), it is asked, and its answer replaces that record in the merge
    retry = shards.unasked_ids(out)
    done = {i for i in answered if i not in retry}
    # an image file changed in place keeps its name, so its query its fingerprint: the
    # digest stored with the answer tells (answers written before digests were kept: not checked)
    stored_digests = shards.done_values(out, "image_sha256") if done and any(map(image_files, queries)) else {}
    moved = {q.id: (q, now) for q in queries if q.id in done and stored_digests.get(q.id)
             and (now := image_digests(q)) is not None and now != stored_digests[q.id]}
    if moved:
        first, (q, now) = next(iter(moved.items()))
        files = image_files(q)
        names = [p.name for p, a, b in zip(files, now, stored_digests[first]) if a != b] or [p.name for p in files]
        raise RunMismatch(
            f"output_dir {out} holds answers to {len(moved)} queries whose image files have changed since "
            f"(e.g. {first}: {', '.join(names)}); their answers are to the old images -- choose another "
            "output_dir or delete that one")
    ranks.barrier()  # every rank has read the files before any rank cuts a torn tail or appends
    # a folder written before a field was kept takes it now, so a later run is checked on it
    if (stored is None or stored != recorded) and ranks.is_main:
        shards.write_atomically(out / RUN_IDENTITY, [json.dumps(identity, indent=2) + "\n"])
    own = shards.own_file(out, ranks.rank, ranks.world_size)
    shards.drop_torn_tail(own)
    # still unreadable and already recorded as such: nothing to write again
    todo = [q for q in mine if q.id not in done and not (q.problem and q.id in retry)]
    asking = {q.id for q in todo}
    if ranks.is_main and len(todo) < len(mine):
        share = " (this process's share)" if ranks.world_size > 1 else ""
        print(f"resuming {out}: {len(mine) - len(todo)} of {len(mine)} queries{share} already answered there; "
              f"asking {len(todo)}", file=sys.stderr)
    bar = _progress(len(mine), len(mine) - len(todo), progress and ranks.is_main)
    with own.open("a") as f:
        invalid = [q for q in todo if q.problem]
        for q in invalid:
            f.write(json.dumps(_json_safe({**q.record, "id": q.id, "benchmark": q.benchmark, "answer": None,
                                           "invalid_input": q.problem, "invalid": True, "correct": False,
                                           "query_fingerprint": prints[q.id]})) + "\n")
        f.flush()
        bar.update(len(invalid))
        # Batches are cut from this rank's whole share, done or not, and seeded by their
        # place in it: a run resumed on the same process count answers its missing queries
        # in the batches, and with the random stream, of an uninterrupted one. Only the
        # missing queries of a batch are asked (none is answered twice); a batch that is
        # partly done -- a kill while its answers were written, or another process count --
        # is asked with fewer rows, so its sampled answers may differ from a straight run's.
        ready = [q for q in mine if not q.problem]
        for start in range(0, len(ready), batch_size):
            batch = [q for q in ready[start : start + batch_size] if q.id in asking]
            if not batch:
                continue
            torch.manual_seed(seed + start)  # sampling is reproducible for a given batch layout
            answers = model(batch)
            if len(answers) != len(batch):
                raise RuntimeError(f"the model answered {len(answers)} of {len(batch)} queries")
            for q, text in zip(batch, answers):
                record = flag_invalid(with_box_frame(to_record(q, text), model))
                if (shown := asked(q).prompt) != q.prompt:  # what the model read, when not the query's wording
                    record["asked_prompt"] = shown
                if digests := image_digests(q):
                    record["image_sha256"] = digests
                f.write(json.dumps(_json_safe({**record, "query_fingerprint": prints[q.id]})) + "\n")
            f.flush()
            bar.update(len(batch))
    bar.close()
    ranks.barrier()  # every rank has finished its shard
    if not ranks.is_main:
        return None
    merged, _ = shards.merge(out, ids)
    by_id = {q.id: q for q in queries}
    # every answer graded by today's rules, and samples.jsonl says what is scored: its
    # ``invalid`` flags are the ones the invalid-answer rate counts (a file written by
    # older parsers is brought up to date; unchanged content is not rewritten)
    merged = [flag_invalid(with_box_frame(regrade(r, by_id[r["id"]]), model)) if r["id"] in by_id else r
              for r in merged]
    judged = None
    if judge is not None:  # after every answer is in: the judge's grades replace the rule's
        from .judge import judge_records

        began = time.perf_counter()
        merged, judged = judge_records(merged, by_id, judge, out, batch_size=judge_batch_size)
        judge_seconds = time.perf_counter() - began
    shards.write_atomically(out / SAMPLES, (json.dumps(_json_safe(r)) + "\n" for r in merged))
    records = [r for r in merged if r["id"] in by_id]
    if len(records) != len(ids):
        missing = sorted(set(by_id) - {r["id"] for r in records})
        raise RuntimeError(f"{len(missing)} queries have no answer after the merge, e.g. {missing[:3]}")
    results = score(records)
    payload = {
        "results": results["results"],
        "invalid": results["invalid"],
        "n_samples": results["n_samples"],
        "configs": {b: {"metrics": sorted(m)} for b, m in results["results"].items()},
        "versions": versions(),
        "config": {**(config or {}), "model": getattr(model, "describe", lambda: {})(), "seed": seed,
                   "batch_size": batch_size, "num_processes": ranks.world_size, "command": " ".join(sys.argv)},
    }
    if judge is not None:
        # its own time: grading is not the model's cost (vlm-report judges after timing the arms)
        payload["judge"] = {"judge": judge.describe(), "benchmarks": judged or {}, "seconds": judge_seconds}
    (out / RESULTS).write_text(json.dumps(_json_safe(payload), indent=2) + "\n")
    return payload


def run_identity(model, seed: int) -> dict:
    """What the answers depend on: the model's description (name, class, mitigations,
    generation settings), a digest of its weights where it has them, and the seed. Batch
    size and process count are left out: greedy answers do not depend on them, and a run
    may resume with others (the tests compare the files byte for byte)."""
    digest = getattr(model, "weights_digest", None)
    identity = {"model": getattr(model, "describe", lambda: {})(), "weights": digest() if digest else None,
                "seed": seed}
    return json.loads(json.dumps(_json_safe(identity)))


class RunMismatch(ValueError):
    """An output folder holds answers of another run (model, weights, mitigations,
    generation settings or seed); the command-line tools report it as a usage error."""


def changed_fields(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted paths of what differs between two run identities, down to the leaf that
    changed (``model.mitigations``, ``model.generate_kwargs``, ``seed``), not just the
    top-level entry holding it."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_fields(a, b, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


#: identity fields added after folders were written without them (path from the top):
#: a stored identity that lacks one was written before it was kept, and is not checked on it,
#: as answers written before image digests were kept are not
ADDED_IDENTITY_FIELDS = (("model", "processor"),)


def _not_recorded_then(stored: dict | None, identity: dict) -> dict | None:
    """``stored`` with each of :data:`ADDED_IDENTITY_FIELDS` it lacks taken from ``identity``."""
    if stored is None:
        return None
    stored = json.loads(json.dumps(stored))
    for *parents, key in ADDED_IDENTITY_FIELDS:
        old, new = stored, identity
        for name in parents:
            old, new = old.get(name) if isinstance(old, dict) else None, new.get(name) if isinstance(new, dict) else None
        if isinstance(old, dict) and isinstance(new, dict) and key not in old and key in new:
            old[key] = new[key]
    return stored


def _read_identity(folder: Path) -> dict | None:
    path = folder / RUN_IDENTITY
    if not path.exists():
        return None  # a new folder, or one written before run.json existed: adopted as is
    return json.loads(path.read_text())


def with_box_frame(record: dict, model) -> dict:
    """``record`` with ``box_frame``, the coordinate frame ``model`` writes boxes in
    (its ``box_frame`` attribute, :mod:`evaluators.box_frames`), and ``empty_abstains``
    where its grounding format answers nothing for nothing found, where its benchmark's
    metrics read boxes (``READS_BOXES``: HalluSegBench): stored with the answer, so that a
    rescore from ``samples.jsonl`` reads it as meant. A model without the attribute leaves
    the record as it is (pixels, or the frame it stored).

    The frame is how answers are read, not what is answered, so it is no part of a run's
    identity: a run resumes under another ``--box_frame`` and every stored answer is read
    in this run's frame (as every answer is graded by today's rules), which is how a run
    read in the wrong frame is scored again without asking the model again."""
    frame = getattr(model, "box_frame", None)
    if frame is None or "benchmark" not in record or not _metrics_attr(record["benchmark"], "READS_BOXES") \
            or record.get("invalid_input"):
        return record
    # and whether an empty answer is its grounding format's "nothing found" (PaliGemma's)
    empty = bool(getattr(getattr(model, "grounding", None), "empty_abstains", False))
    if record.get("box_frame") == frame and record.get("empty_abstains", False) == empty:
        return record
    out = {**record, "box_frame": frame, "empty_abstains": empty}
    if not empty:
        del out["empty_abstains"]
    return out


def flag_invalid(record: dict) -> dict:
    """``record`` (one query's line) with ``invalid`` as its benchmark's metrics read the
    answer: ``evaluators.benchmarks.<bench>.metrics.answer_invalid(record)`` where the
    benchmark defines it (HalluSegBench: no mask can be read from the text), else the
    query's own parse (:func:`evaluators.query.to_record`). The one source of the flag in
    ``samples.jsonl`` and of the invalid-answer rate; a record of an input that could not
    be asked is returned as it is."""
    if record.get("invalid_input") or "benchmark" not in record or record.get("graded_by") == "judge":
        return record  # an LLM judge's grade says itself whether it could read (evaluators.judge)
    rule = _metrics_attr(record["benchmark"], "answer_invalid")
    if rule is None:
        return record
    flag = bool(rule(record))
    return record if record.get("invalid") == flag else {**record, "invalid": flag}


def summary_line(bench: str, payload: dict) -> str:
    """The console line of one benchmark of a :func:`run` payload: its float metrics, the
    number of samples, the invalid-answer rate and, when any, the inputs that could not be
    asked (a missing or corrupt image), which the rate leaves out."""
    values = payload["results"][bench]
    # percentages at one decimal; fractions (HalluSegBench's IoU, ΔIoU and CMS, reported to
    # four decimals in its paper) at four significant digits: 0.1062 had printed as 0.1
    shown = ", ".join(f"{k}={v:.1f}" if abs(v) >= 10 else f"{k}={v:.4g}"
                      for k, v in values.items() if isinstance(v, float))
    invalid = payload["invalid"][bench]
    inputs = invalid.get("invalid_inputs", 0)
    unasked = f", {inputs} input{'s' if inputs != 1 else ''} invalid" if inputs else ""
    return (f"{bench}: {shown}  (n={payload['n_samples'][bench]}, "
            f"invalid answers {invalid['invalid_answer_rate']:.1f}%{unasked})")


def score(records: Sequence[dict]) -> dict:
    """Every registered metric of every benchmark present in ``records`` (pooled, and apart
    by the field its paper reports apart by, e.g. ``results["hallusegbench"]["by_split"]``),
    plus the benchmark's ``details`` tables where it defines them (ReactBench's Table 4).

    ``invalid[bench]``: ``invalid_answer_rate``, the share (%) of the queries asked whose
    answer is invalid by their per-query flag (:func:`flag_invalid`, the ``invalid`` of
    ``samples.jsonl``), and ``invalid_inputs``, the queries that could not be asked. A
    metric record that combines several answers (a HalluSegBench pair, a decomposed MIOH
    set) is not counted again: a combination that names no single image is wrong, not an
    unreadable answer."""
    by_bench: dict[str, list] = defaultdict(list)
    for r in records:
        by_bench[r["benchmark"]].append(r)
    results, invalid, counts = {}, {}, {}
    for bench, rows in sorted(by_bench.items()):
        rows = [flag_invalid(r) for r in rows]
        answered = metric_records(bench, rows)
        results[bench] = _compute(bench, answered)
        details = _metrics_attr(bench, "details")
        if details is not None and answered:  # the paper's tables beyond the registered metrics
            try:
                results[bench]["details"] = details(answered)
            except (KeyError, ValueError, TypeError) as exc:  # fields this data lacks: say so, score the rest
                results[bench].setdefault("_not_computed", {})[f"{bench}.details"] = f"{type(exc).__name__}: {exc}"
        key = _metrics_attr(bench, "REPORTED_APART")
        values = sorted({str(r[key]) for r in answered if key and r.get(key) is not None})
        if key and values:  # e.g. HalluSegBench's referring / reasoning splits (Table 1)
            results[bench][f"by_{key}"] = {v: _compute(bench, [r for r in answered if str(r.get(key)) == v])
                                           for v in values}
        asked = [r for r in rows if not r.get("invalid_input")]
        invalid[bench] = {  # over the queries asked, by their own flags: what samples.jsonl says
            "invalid_answer_rate": 100.0 * sum(bool(r.get("invalid")) for r in asked) / max(len(asked), 1),
            "invalid_inputs": sum(bool(r.get("invalid_input")) for r in rows),
        }
        counts[bench] = len(rows)
    return {"results": results, "invalid": invalid, "n_samples": counts}


def _compute(bench: str, answered: Sequence[dict]) -> dict:
    from .metrics import metrics_for

    out: dict = {}
    for spec in metrics_for(bench):
        try:
            out[spec.name.split(".", 1)[1]] = spec.fn(answered)
        except (KeyError, ValueError, TypeError) as exc:  # a metric whose fields this suite lacks
            out.setdefault("_not_computed", {})[spec.name] = f"{type(exc).__name__}: {exc}"
    return out


def _metrics_attr(bench: str, name: str):
    """``evaluators.benchmarks.<bench>.metrics.<name>`` if defined: ``REPORTED_APART`` (the
    record field the paper reports its metrics apart by) or ``details`` (records -> the
    paper's breakdown tables, stored under ``results[bench]["details"]``)."""
    import importlib

    try:
        module = importlib.import_module(f"evaluators.benchmarks.{bench}.metrics")
    except ModuleNotFoundError:
        return None
    return getattr(module, name, None)


def metric_records(bench: str, rows: Sequence[dict]) -> list[dict]:
    """The records a benchmark's metrics read: answered lines, assembled where a metric
    record spans several queries (HalluSegBench pairs, MIOH decompositions, captions)."""
    assemble = _assembler(bench)
    if assemble is not None:
        return assemble(list(rows))
    return [r for r in rows if not r.get("invalid_input")]


def _assembler(bench: str):
    """``evaluators.benchmarks.<bench>.suite.assemble`` when the benchmark defines one."""
    import importlib

    try:
        module = importlib.import_module(f"evaluators.benchmarks.{bench}.suite")
    except ModuleNotFoundError:
        return None
    return getattr(module, "assemble", None)


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, initial: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface_hub
        return _NoBar()
    return tqdm(total=total, initial=initial, desc="queries", file=sys.stderr, leave=False)
