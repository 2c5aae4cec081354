"""Column types as both products declare them, and as their ``_schema`` endpoints spell them.

``ColumnType.parse`` reads a declared type (``DECIMAL(10,2)``, ``MAP<VARCHAR(10),INT>``, ``DATETIMEV2``)
into the canonical name the emulators reason with; ``schema_properties`` / ``schema_type_name`` are the
reverse, the answer of the FE's table schema endpoint (docs/protocol.md, "Common: table schema endpoint").
How a value is converted to a type lives in ``conversion.py``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.doubles.emulators.load_formats import TableSchema

INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "INT": 32, "BIGINT": 64, "LARGEINT": 128}
# Spellings both products accept for one type, mapped to the name the emulator reasons with.
_ALIASES = {
    "INTEGER": "INT", "BOOL": "BOOLEAN", "TEXT": "STRING", "NUMERIC": "DECIMAL", "DECIMALV3": "DECIMAL",
    "DECIMALV2": "DECIMAL", "DATEV2": "DATE", "DATETIMEV2": "DATETIME", "JSONB": "JSON", "BINARY": "VARBINARY",
}
_SCALARS = set(INT_BITS) | {"BOOLEAN", "FLOAT", "DOUBLE", "DECIMAL", "CHAR", "VARCHAR", "STRING", "DATE", "DATETIME",
                             "JSON", "VARBINARY"}
NESTED = {"ARRAY", "MAP", "STRUCT"}
_TYPE_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\(|\)|<|>|,|:|\d+)")


@dataclass(frozen=True)
class ColumnType:
    """A column type: canonical base name, (length | precision, scale | fraction digits), element types, nullability.

    ``declared`` keeps the name as written (e.g. DECIMALV2, DATETIMEV2), which the ``_schema`` endpoints report.
    ARRAY<T> has one child, MAP<K,V> two, STRUCT<a T, b U> one per field with ``field_names``.
    """

    base: str
    args: tuple[int, ...] = ()
    nullable: bool = True
    children: tuple[ColumnType, ...] = ()
    field_names: tuple[str, ...] = ()
    declared: str = ""

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        body = re.sub(r"\s+NOT\s+NULL\s*$|\s+NULL\s*$", "", text.strip(), flags=re.I)
        nullable = not re.search(r"\bNOT\s+NULL\s*$", text.strip(), flags=re.I)
        tokens = [t for t in _TYPE_TOKEN.findall(body)]
        if "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", body):
            raise ValueError(f"unsupported column type {text!r}")
        try:
            ctype, rest = cls._parse_tokens(tokens)
        except (IndexError, ValueError) as exc:
            raise ValueError(f"unsupported column type {text!r}: {exc}") from None
        if rest:
            raise ValueError(f"unsupported column type {text!r}")
        return ColumnType(ctype.base, ctype.args, nullable, ctype.children, ctype.field_names, ctype.declared)

    @classmethod
    def _parse_tokens(cls, tokens: list[str]) -> tuple[ColumnType, list[str]]:
        name, rest = tokens[0].upper(), tokens[1:]
        base = _ALIASES.get(name, name)
        if base not in _SCALARS | NESTED:
            raise ValueError(f"unknown type {name}")
        args: list[int] = []
        if rest and rest[0] == "(":
            rest = rest[1:]
            while rest[0] != ")":
                if rest[0] != ",":
                    args.append(int(rest[0]))
                rest = rest[1:]
            rest = rest[1:]
        children: list[ColumnType] = []
        names: list[str] = []
        if base in NESTED:
            if not rest or rest[0] != "<":
                raise ValueError(f"{base} needs element types")
            rest = rest[1:]
            while True:
                if base == "STRUCT":
                    names.append(rest[0])
                    rest = rest[1:]
                    if rest[0] == ":":
                        rest = rest[1:]
                child, rest = cls._parse_tokens(rest)
                children.append(child)
                if rest[0] == ",":
                    rest = rest[1:]
                    continue
                if rest[0] != ">":
                    raise ValueError("expected '>'")
                rest = rest[1:]
                break
            expected = {"ARRAY": 1, "MAP": 2}.get(base)
            if expected is not None and len(children) != expected:
                raise ValueError(f"{base} takes {expected} element type(s)")
        return cls(base, tuple(args), True, tuple(children), tuple(names), name), rest

    @property
    def length(self) -> int | None:
        """CHAR/VARCHAR/VARBINARY length in bytes, if declared."""
        return self.args[0] if self.args and self.base in ("CHAR", "VARCHAR", "VARBINARY") else None

    @property
    def precision_scale(self) -> tuple[int, int]:
        """DECIMAL(p[,s]); without arguments DECIMAL(10,0), as in MySQL and both products."""
        return (self.args[0] if self.args else 10, self.args[1] if len(self.args) > 1 else 0)

    def spelled(self) -> str:
        """Upper-case spelling with arguments, e.g. DECIMAL(10,2), MAP<VARCHAR(10),INT>."""
        text = self.base + (f"({','.join(str(a) for a in self.args)})" if self.args else "")
        if self.base == "STRUCT":
            text += "<" + ",".join(f"{n} {c.spelled()}" for n, c in zip(self.field_names, self.children)) + ">"
        elif self.children:
            text += "<" + ",".join(c.spelled() for c in self.children) + ">"
        return text


def schema_properties(schema: TableSchema, product: str, **extra: str) -> list[dict[str, str]]:
    """The ``properties`` of a ``_schema`` answer: name, type, comment, decimals' precision and scale
    (docs/protocol.md, "Common: table schema endpoint"); ``extra`` adds the product's own fields."""
    props = []
    for name, ctype in schema.columns:
        prop: dict[str, str] = {}
        if ctype.base == "DECIMAL":
            precision, scale = ctype.precision_scale
            prop.update(precision=str(precision), scale=str(scale))
        prop.update(type=schema_type_name(ctype, product), comment="", name=name, **extra)
        props.append(prop)
    return props


def schema_type_name(ctype: ColumnType, product: str) -> str:
    """The ``type`` the FE ``_schema`` endpoint reports: the primitive type's name, without lengths or element
    types (docs/protocol.md, "Common: table schema endpoint")."""
    base, declared = ctype.base, ctype.declared
    if base == "DECIMAL":
        if declared == "DECIMALV2":
            return "DECIMALV2"
        precision = ctype.precision_scale[0]
        return ("DECIMAL32" if precision <= 9 else "DECIMAL64" if precision <= 18
                else "DECIMAL128" if precision <= 38 else "DECIMAL256")
    if product == "starrocks":
        if base in NESTED:
            return "INVALID_TYPE"  # complex types have no primitive type (inference, UNCONFIRMED)
        return "VARCHAR" if base == "STRING" else base
    if base == "DATE":
        return "DATEV2"
    if base == "DATETIME":
        return "DATETIMEV2"
    return base
