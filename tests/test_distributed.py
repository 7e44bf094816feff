"""Data-parallel evaluation: shards, per-rank files, merge, resume across process counts.

Two layers of checks:

* in one process, the real runner plays every rank of a 2- or 3-process run one after
  the other (barriers are no-ops then; each rank only reads the files and appends to its
  own) -- fast, and exact about which queries each rank answers;
* real launches: ``accelerate launch`` with two gloo processes on CPU running ``vlm-eval``
  on a tiny organism, compared byte for byte with a one-process run at another batch
  size, and a two-process run whose rank 1 is SIGKILLed mid-run, finished by one process.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators import shards
from evaluators.benchmarks.dobench.suite import build
from evaluators.distributed import Ranks, gpu_slice, shard_of
from evaluators.model import CallableModel
from evaluators.runner import RESULTS, SAMPLES, read_samples, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def queries():
    return build(n_scenes=4, seed=1)


def _answer(images, prompt: str) -> str:
    """Scripted answers that differ from query to query, so a misplaced answer shows."""
    return "yes" if len(prompt) % 3 else "no"


def _run_all_ranks(queries, folder, world: int, batch_size: int, model=None):
    """Every rank of a ``world``-process run, in turn (the main rank last: it merges)."""
    model = model or CallableModel(_answer)
    payload = None
    for rank in reversed(range(world)):
        got = run(queries, model, folder, batch_size=batch_size, progress=False, ranks=Ranks(rank, world))
        assert (got is None) == (rank != 0), "only the main rank returns the payload"
        payload = got if rank == 0 else payload
    return payload


# --- shards ----------------------------------------------------------------------------


def test_shards_are_disjoint_complete_stable_and_order_free(queries):
    ids = [q.id for q in queries]
    for world in (1, 2, 3, 5):
        owned = [[i for i in ids if Ranks(r, world).owns(i)] for r in range(world)]
        assert sorted(i for part in owned for i in part) == sorted(ids), "every sample on exactly one rank"
        shuffled = random.Random(0).sample(ids, len(ids))
        assert [[i for i in shuffled if shard_of(i, world) == r] for r in range(world)] == [
            [i for i in shuffled if i in set(part)] for part in owned], "the list order plays no part"
    # SHA-256 of the id, not Python's salted hash(): the same in every process and version
    assert [shard_of(k, 7) for k in ("a", "dobench-0", "mioh-12")] == [
        int.from_bytes(__import__("hashlib").sha256(k.encode()).digest()[:8], "big") % 7
        for k in ("a", "dobench-0", "mioh-12")]
    sizes = [sum(shard_of(i, 2) == r for i in ids) for r in range(2)]
    assert min(sizes) >= 10, f"a hash shard should not starve a rank: {sizes}"


def test_gpu_slices_are_disjoint_shares_of_a_node():
    assert gpu_slice(8, 0, 2) == [0, 1, 2, 3] and gpu_slice(8, 1, 2) == [4, 5, 6, 7]
    assert gpu_slice(8, 2, 3) == [4, 5]  # 8 // 3 = 2 each; GPUs 6 and 7 stay free
    assert gpu_slice(1, 0, 1) == [0]
    with pytest.raises(ValueError, match="at least one GPU"):
        gpu_slice(2, 0, 4)


# --- the runner playing every rank ------------------------------------------------------


def test_results_do_not_depend_on_process_count_or_batch_size(queries, tmp_path):
    reference = run(queries, CallableModel(_answer), tmp_path / "ref", batch_size=8, progress=False,
                    ranks=Ranks())
    expected = (tmp_path / "ref" / SAMPLES).read_text()
    for world, batch_size in ((2, 3), (3, 1), (1, 40)):
        folder = tmp_path / f"w{world}b{batch_size}"
        payload = _run_all_ranks(queries, folder, world, batch_size)
        assert payload["results"] == reference["results"]
        assert payload["config"]["num_processes"] == world
        assert (folder / SAMPLES).read_text() == expected, "the same merged file, line for line"
        assert shards.rank_files(folder) == [], "rank files are folded into samples.jsonl"


def test_a_killed_run_resumes_on_another_process_count(queries, tmp_path):
    calls = {"n": 0}

    def dies_after(n):
        def answer(images, prompt):
            calls["n"] += 1
            if calls["n"] > n:
                raise KeyboardInterrupt  # the kill
            return _answer(images, prompt)
        return CallableModel(answer)

    # three processes: rank 2 answers its whole shard, rank 1 is killed part-way, rank 0 never starts
    run(queries, dies_after(10**6), tmp_path, batch_size=2, progress=False, ranks=Ranks(2, 3))
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        run(queries, dies_after(5), tmp_path, batch_size=2, progress=False, ranks=Ranks(1, 3))
    with (tmp_path / "samples.rank1.jsonl").open("a") as f:
        f.write('{"id": "torn')  # the line the kill cut
    done = {r["id"] for p in shards.rank_files(tmp_path) for r in read_samples(p)}
    assert 0 < len(done) < len(queries)

    # resumed on two processes: only the queries nobody answered are asked again
    calls["n"] = 0
    resumed = _run_all_ranks(queries, tmp_path, 2, 4, model=dies_after(10**6))
    assert calls["n"] == len(queries) - len(done), "nothing redone"
    ids = [r["id"] for r in read_samples(tmp_path / SAMPLES)]
    assert ids == [q.id for q in queries], "nothing lost, nothing duplicated, in query order"
    fresh = run(queries, CallableModel(_answer), tmp_path / "fresh", progress=False, ranks=Ranks())
    assert resumed["results"] == fresh["results"]
    assert (tmp_path / SAMPLES).read_text() == (tmp_path / "fresh" / SAMPLES).read_text()


def test_merge_drops_duplicates_left_by_a_kill_between_write_and_cleanup(queries, tmp_path):
    run(queries, CallableModel(_answer), tmp_path, progress=False, ranks=Ranks())
    merged = (tmp_path / SAMPLES).read_text()
    lines = merged.splitlines(keepends=True)
    (tmp_path / "samples.rank0.jsonl").write_text("".join(lines[:7]))  # already merged, not yet deleted
    (tmp_path / "samples.rank3.jsonl").write_text("".join(lines[5:9]))
    records, duplicates = shards.merge(tmp_path, [q.id for q in queries])
    assert duplicates == 7 + 4 and len(records) == len(queries)
    assert (tmp_path / SAMPLES).read_text() == merged
    assert shards.rank_files(tmp_path) == []


def test_records_of_queries_outside_the_run_are_kept(queries, tmp_path):
    run(queries, CallableModel(_answer), tmp_path, progress=False, ranks=Ranks())
    payload = _run_all_ranks(queries[:10], tmp_path, 2, 3)
    assert payload["n_samples"]["dobench"] == 10
    ids = [r["id"] for r in read_samples(tmp_path / SAMPLES)]
    assert ids[:10] == [q.id for q in queries[:10]] and sorted(ids) == sorted(q.id for q in queries)


# --- real launches: accelerate, two gloo processes ---------------------------------------

TASKS = ["--tasks", "dobench,mioh", "--limit", "12", "--max_new_tokens", "4", "--no_progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
    return env


def _launch_command(n: int, args: list[str]) -> list[str]:
    """``accelerate launch`` of ``vlm-eval`` on ``n`` processes. On a CPU-only machine
    ``--multi_gpu`` is what starts several processes (``--cpu`` starts one); the runner
    then picks gloo."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port()), "-m", "evaluators.cli", *args]


def _single(model: str, out: Path, batch_size: int) -> None:
    from evaluators.cli import main

    assert main(["--model", model, *TASKS, "--batch_size", str(batch_size), "--output_path", str(out)]) == 0


@pytest.fixture(scope="module")
def reference(eval_model_path, tmp_path_factory) -> Path:
    """A one-process run of the CLI (batch size 5): the numbers every other run must give."""
    out = tmp_path_factory.mktemp("reference")
    _single(eval_model_path, out, 5)
    return out


def test_two_gloo_processes_give_the_one_process_results(eval_model_path, reference, tmp_path):
    out = tmp_path / "two"
    proc = subprocess.run(_launch_command(2, ["--model", eval_model_path, *TASKS, "--batch_size", "2",
                                              "--output_path", str(out)]),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, want = json.loads((out / RESULTS).read_text()), json.loads((reference / RESULTS).read_text())
    assert got["config"]["num_processes"] == 2
    from evaluators.benchmarks.suites import build_suite
    from evaluators.query import first_units

    whole = {t: len(first_units(build_suite(t, 0, "full"), 12)) for t in ("dobench", "mioh")}  # --limit's samples
    assert got["results"] == want["results"] and got["n_samples"] == want["n_samples"] == whole
    assert (out / SAMPLES).read_text() == (reference / SAMPLES).read_text(), "same answers, same order"
    assert len({r["answer"] for r in read_samples(out / SAMPLES)}) > 1, "answers vary, so a mix-up would show"
    assert shards.rank_files(out) == []
    assert proc.stdout.count("dobench:") == 1, "only the main process prints"


def test_killed_two_process_run_finishes_on_one_process(eval_model_path, reference, tmp_path):
    out = tmp_path / "killed"
    command = _launch_command(2, ["--model", eval_model_path, *TASKS, "--batch_size", "1", "--output_path", str(out)])
    command[command.index("-m", 3):command.index("evaluators.cli") + 1] = [str(ROOT / "tests" / "_rank_killed_mid_run.py")]
    proc = subprocess.run(command, cwd=ROOT, env={**_env(), "KILL_AFTER_BATCHES": "4"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0, "rank 1 was killed, so the launch fails"
    by_rank = {p.name: len(read_samples(p)) for p in shards.rank_files(out)}
    assert by_rank.get("samples.rank1.jsonl") == 4, (by_rank, proc.stderr[-3000:])
    assert not (out / SAMPLES).exists() and not (out / RESULTS).exists(), "killed before the merge"

    _single(eval_model_path, out, 3)  # resumed on one process, at another batch size
    assert (out / SAMPLES).read_text() == (reference / SAMPLES).read_text(), "nothing lost or duplicated"
    got, want = json.loads((out / RESULTS).read_text()), json.loads((reference / RESULTS).read_text())
    assert got["results"] == want["results"]
    assert shards.rank_files(out) == []


@pytest.mark.slow
def test_three_processes_with_mitigations_give_the_one_process_results(eval_model_path, tmp_path):
    mitigated = ["--mitigations", "vcd:alpha=1,prior_suppression:mode=both"]
    from evaluators.cli import main

    assert main(["--model", eval_model_path, *TASKS, *mitigated, "--batch_size", "4",
                 "--output_path", str(tmp_path / "one")]) == 0
    proc = subprocess.run(_launch_command(3, ["--model", eval_model_path, *TASKS, *mitigated, "--batch_size", "3",
                                              "--output_path", str(tmp_path / "three")]),
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "three" / SAMPLES).read_text() == (tmp_path / "one" / SAMPLES).read_text()
    got, want = (json.loads((tmp_path / d / RESULTS).read_text()) for d in ("three", "one"))
    assert got["results"] == want["results"] and got["config"]["num_processes"] == 3
