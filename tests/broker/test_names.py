"""Names (ids, keys, tags, groups) the broker stores and reads back intact."""

from __future__ import annotations

import sys

from broker_embedded.message import is_name


def test_a_name_refuses_every_whitespace_and_unprintable_character_and_takes_every_other() -> None:
    for code_point in range(sys.maxunicode + 1):
        character = chr(code_point)
        expected = character.isprintable() and not character.isspace()
        assert is_name(f"a{character}b") is expected, hex(code_point)


def test_a_name_is_a_string_of_one_to_max_length_characters() -> None:
    assert is_name("x" * 127) and not is_name("x" * 128) and not is_name("")
    assert is_name("x" * 64, 64) and not is_name("x" * 65, 64)
    assert not is_name(b"bytes") and not is_name(None)
