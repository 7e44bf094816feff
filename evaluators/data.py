"""Reading benchmark files: errors that name the file, line and field; images that may be
missing or corrupt mark their sample invalid instead of stopping the run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from PIL import Image, UnidentifiedImageError


class DataError(ValueError):
    """A malformed benchmark file: ``file``, ``line`` (1-based, or item index for JSON lists), ``field``."""

    def __init__(self, file: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.file, self.line, self.field = str(file), line, field
        where = f"{file}" + (f", line {line}" if line is not None else "") + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


def read_json_list(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Items of a JSON file holding a list of objects, with their 1-based index."""
    path = Path(path)
    _check_file(path, "a JSON file holding a list of items")
    try:
        data = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise DataError(path, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
    if isinstance(data, dict):  # some releases wrap the list: {"data": [...]}
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DataError(path, None, None, "expected a list of items (or an object holding exactly one list)")
        data = lists[0]
    if not isinstance(data, list):
        raise DataError(path, None, None, f"expected a list of items, got {type(data).__name__}")
    if not data:
        raise DataError(path, None, None, "holds no items")
    for i, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise DataError(path, i, None, f"item must be an object, got {type(item).__name__}")
        yield i, item


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Records of a JSON Lines file with their 1-based line numbers (blank lines skipped)."""
    path = Path(path)
    _check_file(path, "a JSON Lines file, one record per line")
    read = 0
    for n, line in enumerate(_text(path).split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
        if not line.strip():
            continue
        read += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, n, None, f"invalid JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise DataError(path, n, None, f"a record must be an object, got {type(record).__name__}")
        yield n, record
    if not read:  # an empty file would leave its benchmark out of the results without a word
        raise DataError(path, None, None, "holds no records")


def _check_file(path: Path, expected: str) -> None:
    """A DataError unless ``path`` is a file: a folder is said to be one (it was reported as
    "file not found", which sent users looking for a typo), with what was expected instead."""
    if path.is_dir():
        raise DataError(path, None, None, f"is a directory, not a file: give {expected}")
    if not path.is_file():
        raise DataError(path, None, None, "file not found")


def _text(path: Path) -> str:
    """A data file's text: UTF-8 (JSON's encoding), with or without a BOM, whatever the
    locale; other bytes are a DataError naming the file and line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(path, line, None, f"not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                        "save the file as UTF-8") from None


def field(record: dict, name: str, types: type | tuple, file: str | Path, line: int,
          choices: tuple | None = None, optional: bool = False) -> Any:
    """``record[name]`` checked for presence, type and allowed values."""
    if name not in record or record[name] is None:
        if optional:
            return None
        raise DataError(file, line, name, "missing")
    value = record[name]
    allowed = types if isinstance(types, tuple) else (types,)
    # JSON's true / false are Python bools, which are ints: "level": true had passed as level 1
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in allowed):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise DataError(file, line, name, f"expected {names}, got {type(value).__name__} {value!r}")
    if choices is not None and value not in choices:
        raise DataError(file, line, name, f"must be one of {list(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class ImageRef:
    """A path to an image that is opened only when needed; ``problem`` says why it is unusable."""

    path: Path

    @property
    def problem(self) -> str | None:
        if not self.path.is_file():
            return f"missing image {self.path}"
        try:  # a full decode: verify() reads no JPEG data, so a truncated download passed it and
            with Image.open(self.path) as img:  # then stopped the whole run when it was opened
                img.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            return f"corrupt image {self.path}: {exc}"
        return None

    def open(self, mode: str = "RGB") -> Image.Image:
        with Image.open(self.path) as img:
            return img.convert(mode)
