"""results.jsonl: whole-line appends by process 0, flushed with their folder when they create
a name, and a reader that skips a killed run's cut-off last line but refuses a damaged
file."""
import concurrent.futures
import json
import os
import stat
import threading

import jax
import pytest

from t5x_lite import results


def test_appended_records_read_back_in_order(tmp_path):
    file = results.ResultsFile(tmp_path)
    assert file.path == tmp_path / "results.jsonl" == results.results_path(tmp_path)
    assert file.records() == []  # no file yet
    file.append({"point": "a", "metrics": {"accuracy": 50.0}})
    file.append({"point": "b", "metrics": {}})
    assert file.path.read_text() == (json.dumps({"point": "a", "metrics": {"accuracy": 50.0}})
                                     + "\n" + json.dumps({"point": "b", "metrics": {}}) + "\n")
    assert file.records() == [{"point": "a", "metrics": {"accuracy": 50.0}},
                              {"point": "b", "metrics": {}}]


def test_a_cut_off_last_line_is_skipped_with_a_warning_then_cut(tmp_path):
    file = results.ResultsFile(tmp_path)
    file.append({"point": "a"})
    with open(file.path, "a") as f:
        f.write('{"point": "b", "met')  # killed in the middle of writing a line
    with pytest.warns(UserWarning, match=r"results.jsonl line 2: skipping a partly written "
                                         r"last line \(a killed run's\): '\{\"point\": \"b\""):
        assert file.records() == [{"point": "a"}]
    with pytest.warns(UserWarning, match="dropping a partly written last line"):
        file.finish_last_line()
    file.append({"point": "c"})
    assert [r["point"] for r in file.records()] == ["a", "c"]  # no warning: the file is whole


def test_an_append_after_another_job_s_short_write_starts_a_line_of_its_own(tmp_path):
    """A SLURM array task whose write fell short (a full disk) leaves a fragment; another task,
    running since before it, appended right after it: its finished record was glued to the
    fragment, and deleting the damaged line that every read then named deleted that record."""
    file = results.ResultsFile(tmp_path)
    file.append({"point": "a"})
    with open(file.path, "a") as f:
        f.write('{"point": "b", "met')  # the other task's short write
    file.append({"point": "c"})
    lines = file.path.read_text().splitlines()
    assert lines == ['{"point": "a"}', '{"point": "b", "met', '{"point": "c"}']
    with pytest.raises(results.ResultsError, match="line 2 is not JSON"):
        file.records()
    file.path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")  # the advice taken
    assert [r["point"] for r in file.records()] == ["a", "c"]


def test_a_whole_record_without_its_newline_is_kept(tmp_path):
    file = results.ResultsFile(tmp_path)
    file.path.write_text('{"point": "a"}\n\n{"point": "b"}')  # blank lines hold no record
    assert file.records() == [{"point": "a"}, {"point": "b"}]
    file.finish_last_line()
    file.append({"point": "c"})
    assert [r["point"] for r in file.records()] == ["a", "b", "c"]


def test_a_damaged_line_before_the_last_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"point": "a"}\n{"point": \n{"point": "c"}\n')
    with pytest.raises(results.ResultsError, match=rf"{path} line 2 is not JSON .*repair or "
                                                   "delete that line"):
        results.read_records(path)
    # Even as the last line: with its newline it was written whole, so it is damage.
    path.write_text('{"point": "a"}\nnot json\n')
    with pytest.raises(results.ResultsError, match="line 2 is not JSON"):
        results.read_records(path)


def test_only_process_zero_writes(tmp_path, monkeypatch):
    file = results.ResultsFile(tmp_path)
    file.path.write_text('{"point": "cut sho')
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    file.finish_last_line()
    file.append({"point": "a"})
    assert file.path.read_text() == '{"point": "cut sho'


def test_writers_of_one_file_at_once_neither_collide_nor_tear_it(tmp_path):
    """The array tasks of a SLURM sweep start together on a new workdir and each writes its
    sweep.json: with one fixed temporary name, a writer renamed another's half-written file
    away (FileNotFoundError) and readers met torn text."""
    path = tmp_path / "sweep.json"
    texts = [json.dumps({"writer": i, "padding": "x" * 200_000}) for i in range(4)]
    results.write_atomically(path, texts[0])
    stop, seen = threading.Event(), set()

    def write(text):
        for _ in range(30):
            results.write_atomically(path, text)

    def read():
        while not stop.is_set():
            seen.add(json.loads(path.read_text())["writer"])  # never a torn file

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        readers = [pool.submit(read) for _ in range(2)]
        for writer in [pool.submit(write, text) for text in texts]:
            writer.result()  # raises what a writer raised
        stop.set()
        for reader in readers:
            reader.result()
    assert seen <= set(range(4)) and json.loads(path.read_text())["writer"] in range(4)
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.json"]  # no temporary file left


def test_a_new_name_is_flushed_with_its_folder(tmp_path, monkeypatch):
    """A file's fsync does not keep a rename or a new file through a power cut; its folder's
    does. Which descriptors are flushed, folders marked True:"""
    flushed, fsync = [], os.fsync

    def recording_fsync(fd):
        flushed.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        fsync(fd)

    monkeypatch.setattr(results.os, "fsync", recording_fsync)
    results.write_atomically(tmp_path / "record.json", "{}")
    assert flushed == [False, True]  # the text, then the folder holding the renamed file
    flushed.clear()
    file = results.ResultsFile(tmp_path)
    file.append({"point": "a"})
    file.append({"point": "b"})
    assert flushed == [False, True, False]  # the folder once: when the first line made the file
