"""What every section is made of: a Record (a frozen dataclass read tolerantly from a
producer's dict), a Section (a Record that keeps its raw dict and the reason it was not
measured), and the readers of a stored value.

Reading never fails and never converts: a number is kept as stored (an int stays an int, so a
figure copied into a finding's evidence reads the same), a value of the wrong kind or a missing
key reads as None (an empty dict, list or tuple for containers)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


def number(v) -> int | float | None:
    """v as stored when it is a number (an int or a float, not a bool), else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def text(v) -> str | None:
    return v if isinstance(v, str) else None


def flag(v) -> bool | None:
    return None if v is None else bool(v)


def mapping(v) -> dict:
    """v when it is a dict (the producer's own object, not a copy), else {}."""
    return v if isinstance(v, dict) else {}


def mapping_or_none(v) -> dict | None:
    return v if isinstance(v, dict) else None


def items(v) -> list:
    """v when it is a list (the producer's own object), else []."""
    return v if isinstance(v, list) else []


# How a field is read, by its annotation. A field of another type is read by the class's own
# `_nested`.
READERS = {"float | None": number, "int | None": number, "str | None": text,
           "bool | None": flag, "dict": mapping, "dict | None": mapping_or_none, "list": items}


def key(name: str):
    """A field stored under another name than its own (a Python keyword: "from")."""
    return field(default=None, metadata={"key": name})


@dataclass(frozen=True)
class Record:
    """A frozen view of one dict a producer wrote: the fields `_nested` reads (nested records,
    keys stored elsewhere), and every other plain field from the key of its name (READERS)."""

    @classmethod
    def from_dict(cls, d):
        return cls(**cls._values(mapping(d)))

    @classmethod
    def _values(cls, d: dict) -> dict:
        out = cls._nested(d)
        for f in fields(cls):
            reader = READERS.get(f.type)
            if f.name not in out and f.name not in ("raw", "not_measured") and reader is not None:
                out[f.name] = reader(d.get(f.metadata.get("key", f.name)))
        return out

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {}


@dataclass(frozen=True)
class Section(Record):
    """One instrument's section of Profile.measurements. `raw` is the producer's dict itself
    (for the rare reader that shows a whole section); `not_measured` the reason it gave when it
    could not measure (then its figures are None)."""

    raw: dict = field(default_factory=dict, repr=False, compare=False)
    not_measured: str | None = None

    @property
    def present(self) -> bool:
        """The profile has this section: measured, or saying why not."""
        return bool(self.raw)

    @classmethod
    def from_dict(cls, d):
        d = mapping(d)
        return cls(raw=d, not_measured=d.get("not_measured"), **cls._values(d))
