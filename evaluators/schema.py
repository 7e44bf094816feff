"""Declarative JSON Lines schemas for benchmarks without a public data release.

A schema is a tuple of :class:`Field` rows (plain data); :func:`load_jsonl` validates each
record against it and resolves image paths, raising :class:`~evaluators.data.DataError`
with file, line and field for anything malformed. Image problems (missing, corrupt) do not
raise: they are returned per record so the run can count them and go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import DataError, ImageRef, field, read_jsonl


@dataclass(frozen=True)
class Field:
    name: str
    types: type | tuple
    choices: tuple | None = None
    optional: bool = False
    images: bool = False  # a path or list of paths, resolved against the file's folder
    doc: str = ""


def load_jsonl(path: str | Path, schema: tuple[Field, ...], image_root: str | Path | None = None) -> list[dict]:
    """Validated records; image fields become :class:`ImageRef` (or lists of them) and each
    record gets ``_line`` (its line number) and ``_problem`` (why it cannot run, or None)."""
    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    known = {f.name for f in schema}
    out = []
    first_line: dict[str, int] = {}
    for line, record in read_jsonl(path):
        if "id" in known and "id" in record:
            rid = str(record["id"])
            if rid in first_line:  # a run resumes by id: the second would be taken as answered
                raise DataError(path, line, "id", f"{rid!r} already used on line {first_line[rid]}")
            first_line[rid] = line
        row: dict[str, Any] = {}
        for f in schema:
            value = field(record, f.name, f.types, path, line, choices=f.choices, optional=f.optional)
            if f.images and value is not None:
                paths = value if isinstance(value, list) else [value]
                if not paths or not all(isinstance(p, str) for p in paths):
                    raise DataError(path, line, f.name, "expected a path or a non-empty list of paths")
                refs = [ImageRef(Path(p) if Path(p).is_absolute() else root / p) for p in paths]
                value = refs if isinstance(record[f.name], list) else refs[0]
            row[f.name] = value
        row.update({k: v for k, v in record.items() if k not in known})  # extra fields kept as metadata
        refs = [r for f in schema if f.images and row.get(f.name) is not None
                for r in (row[f.name] if isinstance(row[f.name], list) else [row[f.name]])]
        row["_line"] = line
        row["_problem"] = next((p for p in (r.problem for r in refs) if p), None)
        out.append(row)
    return out


def schema_markdown(title: str, schema: tuple[Field, ...]) -> str:
    """The schema as a Markdown table (used to keep each benchmark's schema.md in step)."""
    rows = "\n".join(
        f"| `{f.name}` | {f.types.__name__ if isinstance(f.types, type) else ' or '.join(t.__name__ for t in f.types)}"
        f"{' (image path' + ('s' if f.types is list else '') + ')' if f.images else ''} | "
        f"{', '.join(map(str, f.choices)) if f.choices else ''} | {'no' if f.optional else 'yes'} | {f.doc} |"
        for f in schema
    )
    return f"# {title}\n\n| field | type | values | required | meaning |\n|---|---|---|---|---|\n{rows}\n"
