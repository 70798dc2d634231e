"""The gallery's URL convertors: `{name:id}` for row ids, registered with Starlette on import."""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class IdConvertor(Convertor):
    """A row id in a URL: at most 9 digits, so it always fits PostgreSQL's integer (a longer one is a 404,
    never a database error)."""

    regex = "[0-9]{1,9}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(value)


register_url_convertor("id", IdConvertor())
