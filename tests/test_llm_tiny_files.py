"""The tiny model's files are replaced whole: a process reading the shared default directory
(parallel test runs) never sees a file another one is still writing."""

from __future__ import annotations

import os

import pytest
import safetensors.numpy

from pygpukit import llm
from pygpukit.llm.tiny import write_tiny_model


def test_a_write_that_fails_midway_leaves_the_previous_files_whole(tmp_path, monkeypatch):
    path = write_tiny_model(str(tmp_path))
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(path)}

    def half_written(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 64)  # a reader between here and the end would see this
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", half_written)
    with pytest.raises(OSError, match="disk full"):
        write_tiny_model(path)
    after = {n: (tmp_path / n).read_bytes() for n in os.listdir(path)}
    assert after == before  # nothing half written, no temporary left behind
    monkeypatch.undo()
    model = llm.load(path)
    assert model.config.vocab_size > 0
