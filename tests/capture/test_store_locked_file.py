"""A capture file another process holds open for writing: one line saying so, never an --overwrite hint."""

from __future__ import annotations

import subprocess
import sys

import pytest
from zyfa.capture.store import CaptureFormatError, open_capture
from zyfa.capture.writer import CaptureWriter

from tests.capture.test_store_schema_and_errors import IDS, _meta, _write


@pytest.fixture
def held_open(tmp_path):
    """A complete capture, held open for writing by a second process (as a running capture holds it)."""
    path = tmp_path / "c.h5"
    _write(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, h5py; f = h5py.File(sys.argv[1], 'a'); print('open', flush=True); "
         "time.sleep(120)", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        yield path
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_locked_file_is_named_as_locked(held_open):
    path = held_open
    want = f"{path} is locked: another process (a capture still running?) has it open for writing"
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == want
    with pytest.raises(CaptureFormatError) as e:  # the writer passes it on as it is: no "--overwrite" advice
        CaptureWriter(path, _meta(), IDS)
    assert str(e.value) == want and type(e.value) is CaptureFormatError
