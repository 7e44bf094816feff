"""mioh: JSON Lines schema and loader (see schema.md)."""

from .schema import SCHEMA, load

__all__ = ["SCHEMA", "load"]
