"""Every table of measured figures in README.md and docs/ is what its benchmark's JSON renders to.

Tables sit between ``<!-- table: NAME -->`` and ``<!-- /table -->``; ``scripts/doc_tables.py``
renders them from ``benchmarks/results/*.json`` through each benchmark's record (``make docs``).
A figure edited by hand, a benchmark rerun without ``make docs``, or a results file whose keys
no longer match its record, fails here.
"""

from __future__ import annotations

import json
import re

import pytest

from benchmarks._common import RESULTS, decode, encode, write_record
from scripts import doc_tables

TABLES = doc_tables.renderers()
RECORDS = doc_tables.result_records()
RESULT_FILES = sorted(RESULTS.glob("*.json"))
DOCS = doc_tables.documents()
TABLE_ROW = re.compile(r"^\|.*\|\s*$")
MEASURED = re.compile(r"\d+\.\d+\s*(?:ms|s|x|%|GB/s|MiB|MB)|\d+(?:\.\d+)?\s*(?:ms|x)\b")


def _where(path) -> str:
    return str(path.relative_to(doc_tables.ROOT))


@pytest.mark.parametrize("path", DOCS, ids=_where)
def test_generated_tables_match_their_json(path) -> None:
    problems = doc_tables.stale_blocks(path.read_text(), TABLES, where=_where(path))
    assert not problems, "\n\n".join(problems) + "\n\nrun `make docs` to regenerate"


def test_every_renderer_is_used() -> None:
    unused = set(TABLES) - doc_tables.used_names(DOCS)
    assert not unused, f"renderers that no document uses: {sorted(unused)}"


def test_a_figure_edited_by_hand_is_caught() -> None:
    """Change one digit of each generated table: the check must name that table."""
    checked = 0
    for path in DOCS:
        text = path.read_text()
        for m in doc_tables.BLOCK.finditer(text):
            body_start = m.start("body")
            digit = re.search(r"\d", m.group("body"))
            if digit is None:
                continue
            i = body_start + digit.start()
            edited = text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :]
            problems = doc_tables.stale_blocks(edited, TABLES, where=_where(path))
            assert any(repr(m.group("name")) in p for p in problems), (path, m.group("name"))
            checked += 1
    assert checked == len([m for p in DOCS for m in doc_tables.BLOCK.finditer(p.read_text())])


def test_measured_tables_are_all_generated() -> None:
    """A table row with a measured figure (ms, s, x, %, GB/s) outside a generated block is a
    number that no JSON backs."""
    loose = []
    for path in DOCS:
        text = doc_tables.BLOCK.sub("", path.read_text())
        for line in text.splitlines():
            if TABLE_ROW.match(line) and MEASURED.search(line):
                loose.append(f"{_where(path)}: {line.strip()[:100]}")
    assert not loose, "measured figures outside generated tables:\n" + "\n".join(loose)


def test_every_results_file_has_a_record() -> None:
    stems = {p.stem for p in RESULT_FILES}
    assert stems == set(RECORDS), (
        f"results files without a record: {sorted(stems - set(RECORDS))}; "
        f"records without a file: {sorted(set(RECORDS) - stems)}"
    )


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.name)
def test_a_results_file_loads_through_its_record_unchanged(path) -> None:
    """Every key of the file is a field of its record and every field a key: decoding and
    encoding again gives the file back (as JSON objects, key order aside)."""
    data = json.loads(path.read_text())
    record = decode(RECORDS[path.stem], data, path.stem)
    assert encode(record) == data


def test_a_renamed_key_is_refused_with_its_path() -> None:
    """The record checks keys both ways: one renamed key in a row names that row and key."""
    data = json.loads((RESULTS / "pp_runtime.json").read_text())
    data["schedules"][1]["paired_speedup_renamed"] = data["schedules"][1].pop("paired_speedup")
    with pytest.raises(ValueError, match=r"pp_runtime\.schedules\[1\].*paired_speedup_renamed"):
        decode(RECORDS["pp_runtime"], data, "pp_runtime")


def test_a_benchmark_writes_through_its_record(tmp_path) -> None:
    """``write_record`` writes what loads back; data that does not fit its record is refused,
    naming the key, and kept beside the target so that a long run's figures survive."""
    data = json.loads((RESULTS / "merge.json").read_text())
    kind = RECORDS["merge"]
    path = write_record(tmp_path / "merge.json", kind, data)
    assert json.loads(path.read_text()) == data
    data["results"][0]["kmerge_seconds"] = data["results"][0].pop("seconds")
    with pytest.raises(ValueError, match=r"merge\.results\[0\].*kmerge_seconds"):
        write_record(tmp_path / "merge.json", kind, data)
    assert json.loads((tmp_path / "merge.unmatched.json").read_text()) == data
    assert "kmerge_seconds" not in (tmp_path / "merge.json").read_text()


def test_the_runtime_record_takes_what_the_library_profile_writes() -> None:
    """``benchmarks/pp_runtime.py`` writes ``Profile.to_dict()`` under ``profile``: its record
    (a mirror of the library's ``Profile``, ``mem_b`` and ``split_overhead`` written as keys)
    must decode exactly that, so a field renamed in the library fails here, not after a run."""
    from benchmarks.records.pp_runtime import RuntimeProfile
    from nobubble.pipeline.runtime.profile_data import Profile, StageProfile

    stage = StageProfile(stage=0, blocks=(0, 1), t_f=1.0, t_b=1.0, t_w=0.5, t_bw_fused=1.25,
                         mem_f=64, mem_w=16, bw_ratio=1.2, out_bytes=8)  # fmt: skip
    written = Profile(model="gpt", microbatch_size=2, stages=(stage,), t_comm=0.1,
                      activation_bytes=8, clock="cpu").to_dict()  # fmt: skip
    written = json.loads(json.dumps(written))  # as the file holds it: tuples are lists
    assert encode(decode(RuntimeProfile, written, "profile")) == written
