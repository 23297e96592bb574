"""``--text FILE``: one's own UTF-8 prompts beside the shipped texts; a missing or non-UTF-8 file is refused in one
line before any model loads."""

from __future__ import annotations

import pytest
from zyfa.capture.text import UnknownTextError, check_text, load_text

from zyfa.cli import main


def test_a_utf8_file_is_a_text_named_by_its_path(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("Grüße aus Köln.\nSecond line.\n", encoding="utf-8")
    check_text(str(f))
    t = load_text(str(f))
    assert t.name == str(f) and t.text == "Grüße aus Köln.\nSecond line.\n"
    assert str(f) in t.provenance and t.sha256 in t.provenance


@pytest.mark.parametrize("content,message", [(None, "no such file"), (b"\xff\xfe latin", "is not UTF-8 text"),
                                             (b"  \n", "is empty")])
def test_missing_non_utf8_or_empty_files_are_refused(tmp_path, content, message):
    f = tmp_path / "prompts.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(UnknownTextError, match=message):
        check_text(str(f))


@pytest.mark.parametrize("command", [["impact"], ["longctx"], ["capture", "--model", "smollm2", "--out", "x.h5"]])
def test_every_command_with_text_refuses_a_bad_file_in_one_line(tmp_path, capsys, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\xe9".encode("latin-1"))
    assert main([*command, "--text", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not UTF-8 text" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt"]
