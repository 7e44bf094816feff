"""Per-sample files on disk: one per rank while a run is going, one merged file after.

Layout of an output folder::

    samples.jsonl          the merged, deduplicated records, in query order
    samples.rank<R>.jsonl  what rank R of a multi-process run has answered since the last merge

Choices:

* **Every rank appends only to its own file** (one process runs: straight to
  ``samples.jsonl``), so no two processes ever write one file and no locking is needed;
  a file is flushed after each batch, so a kill loses at most the batch being answered
  and a torn last line, which :func:`read_samples` skips and :func:`drop_torn_tail` cuts.
* **"Done" is read from every file** (:func:`done_ids`): the merged file and the rank
  files of *any* earlier process count. A run killed on 2 processes and resumed on 1 or
  3 therefore neither redoes nor loses a sample; the rank files are named by rank only,
  so a rerun's rank R appends to whatever rank R left behind.
* **An input that could not be asked is asked again** once it can be (a missing image
  restored): the runner does not count a record with ``invalid_input`` as done
  (:func:`unasked_ids`), and its answer then replaces that record in the merge.
* **The main rank merges after everyone has finished** (:func:`merge`): records are
  deduplicated by sample id (first seen wins: the merged file, then ranks in order -- a
  duplicate arises when a kill falls between writing the merged file and deleting the
  rank files, and then both copies are the same answer -- except that an answer always
  replaces a record of an input that could not be asked), written in the order of the
  queries (records of queries not in this run keep their place after them), so the file
  is the same for any process count, batch size or resume history. It is written to a
  temporary file and renamed over ``samples.jsonl`` before the rank files are removed:
  a kill at any point leaves every answer on disk at least once.
* Multi-node runs need the output folder on a filesystem every node sees (NFS, Lustre,
  ...): ranks learn what is done, and the main rank merges, by reading files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

SAMPLES = "samples.jsonl"
_RANK_FILE = re.compile(r"samples\.rank(\d+)\.jsonl")


def read_samples(path: str | Path) -> list[dict]:
    """Records of a samples file; a torn last line (a kill mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with path.open() as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # only the line being written when the run was killed can be torn
            if isinstance(record, dict) and "id" in record:
                out.append(record)
    return out


def drop_torn_tail(path: Path) -> None:
    """Cut a last line left without its newline by a kill, so appends start on a fresh line.

    Only ever called by the one process that appends to ``path``, before it appends.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:  # killed between a record's "}" and its newline: the record is whole, and was counted as done
        complete = isinstance(json.loads(data[start:]), dict)
    except ValueError:
        complete = False
    if complete:
        with path.open("ab") as f:
            f.write(b"\n")
    else:
        os.truncate(path, start)


def own_file(folder: Path, rank: int, world_size: int) -> Path:
    """The file this rank appends to: ``samples.jsonl`` alone, ``samples.rank<R>.jsonl`` in company."""
    return folder / (SAMPLES if world_size == 1 else f"samples.rank{rank}.jsonl")


def rank_files(folder: Path) -> list[Path]:
    """Every per-rank file in ``folder`` (of any earlier process count), by rank."""
    found = [(int(m.group(1)), p) for p in folder.glob("samples.rank*.jsonl") if (m := _RANK_FILE.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def _all_files(folder: Path) -> list[Path]:
    return [folder / SAMPLES, *rank_files(folder)]


def done_ids(folder: Path) -> set[str]:
    """Ids answered in any samples file of ``folder``."""
    return set(done_fingerprints(folder))


def done_fingerprints(folder: Path) -> dict[str, str | None]:
    """Ids answered in any samples file of ``folder``, with the fingerprint of the query each
    answers (:func:`evaluators.query.fingerprint`; None in files written before it was kept)."""
    return done_values(folder, "query_fingerprint")


def done_values(folder: Path, key: str) -> dict[str, Any]:
    """Ids recorded in any samples file of ``folder``, with their records' ``key`` (None where absent)."""
    return {r["id"]: r.get(key) for path in _all_files(folder) for r in read_samples(path)}


def unasked_ids(folder: Path) -> set[str]:
    """Ids whose every record in ``folder`` is of an input that could not be asked (a
    missing or corrupt image: ``invalid_input``): not done, asked again when the input can
    be read (a rerun after the user restored the image)."""
    unasked, answered = set(), set()
    for path in _all_files(folder):
        for r in read_samples(path):
            (unasked if r.get("invalid_input") else answered).add(r["id"])
    return unasked - answered


def merge(folder: Path, order: Sequence[str]) -> tuple[list[dict], int]:
    """Fold every rank file into ``samples.jsonl``; returns ``(records, duplicates dropped)``.
    Of two records of one id the first is kept, unless it is of an input that could not be
    asked and the other answers it (the input restored and asked on a rerun).

    ``order``: the query ids of this run; their records come first, in this order.
    """
    seen: dict[str, dict] = {}
    duplicates = 0
    for path in _all_files(folder):
        for record in read_samples(path):
            if record["id"] in seen:
                duplicates += 1
                if seen[record["id"]].get("invalid_input") and not record.get("invalid_input"):
                    seen[record["id"]] = record  # the input, restored since, asked: its answer replaces it
            else:
                seen[record["id"]] = record
    position = {key: i for i, key in enumerate(order)}
    records = sorted(seen.values(), key=lambda r: position.get(r["id"], len(position)))  # stable: others keep place
    write_atomically(folder / SAMPLES, (json.dumps(r) + "\n" for r in records))
    for path in rank_files(folder):
        path.unlink()
    return records, duplicates


def write_atomically(path: Path, lines: Iterable[str]) -> None:
    """Write ``lines`` to ``path`` through a temporary file and a rename; skip it when the
    content is already there (a rerun with nothing new leaves the file untouched)."""
    text = "".join(lines)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
