"""A column of a store table: its name, type and codec, as its DDL declares it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    codec: str = "ZSTD(1)"

    def ddl(self) -> str:
        return (
            f"`{self.name}` {self.type} CODEC({self.codec})"
            if self.codec
            else (f"`{self.name}` {self.type}")
        )


def col(name: str, type_: str, codec: str = "ZSTD(1)") -> Column:
    return Column(name, type_, codec)
