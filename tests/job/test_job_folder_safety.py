"""Nothing batchgen did not write is ever deleted or overwritten (issue 20, defects 2, 5 and 12):

- the manifest is validated when loaded: a shard name that is not one plain file name
  (``../x``, an absolute path, ``sub/x``, a side file's name) is refused, and ``--restart``
  then deletes nothing outside the folder;
- ``--restart`` deletes only regular files batchgen wrote, never through a symbolic link, and
  refuses (before deleting anything) when a file of other origin sits under a name the run writes;
- batchgen's own file names are reserved: an input shard whose output would take one is refused;
  ``run-batch`` names its side files after its output file, so two batches share a folder and a
  user's ``summary.json`` there is untouched;
- a job with OpenAI response files as outputs writes its report (error examples from the error
  lines) and exits 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from batchgen.io import InputError, JobFolder, Manifest
from batchgen.job.resume import open_manifest
from tests.job.helpers import write_job
from tests.job.test_job_safety import good_job, job_data, run, run_main, snapshot, write_shard
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _manifest_with(out_dir: Path, name: str) -> None:
    """A manifest whose one committed shard is called `name` (a tampered or copied folder)."""
    record = {
        "input_path": "x", "input_size": 1, "input_footer_hash": "", "num_input_rows": 1,
        "num_output_rows": 1, "rows_by_status": {"ok": 1, "error": 0}, "error_codes": {},
        "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "wall_s": 0.0,
    }
    data = {"format": 2, "fingerprint": {}, "job_time": "2026-12-01T00:00:00", "shards": {name: record}, "bad_shards": {}}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").write_text(json.dumps(data))


# --- the manifest's names ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../victim.parquet", "/ABS/victim.parquet", "sub/victim.parquet", "..", ".", "",
                                  "summary.json", "timeline.parquet", ".hidden.parquet"])
def test_a_manifest_naming_a_path_outside_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    name = name.replace("/ABS", str(tmp_path))
    _manifest_with(tmp_path / "out", name)
    with pytest.raises(InputError, match="not a valid batchgen manifest"):
        Manifest.load(tmp_path / "out")


@pytest.mark.parametrize("name", ["../victim.parquet", "/ABS/victim.parquet"])
def test_restart_with_a_tampered_manifest_deletes_nothing_outside(
    tmp_path: Path, name: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before the fix, --restart unlinked out_dir / name for each entry: ../x or /abs/x anywhere.
    victim = write_shard(tmp_path / "victim.parquet", 0, 2)
    job = good_job(tmp_path, model_dir)
    _manifest_with(tmp_path / "out", name.replace("/ABS", str(tmp_path)))
    rc, _, err = run(job, capsys)
    assert rc == 2 and "not a valid batchgen manifest" in err, err
    rc, _, err = run(job, capsys, "--restart")  # what the message suggests
    assert rc == 0, err
    assert victim.is_file()


def test_restart_never_deletes_through_a_symlink_nor_a_file_it_did_not_write(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = good_job(tmp_path, model_dir)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    out = tmp_path / "out"
    precious = write_shard(tmp_path / "precious" / "data.parquet", 0, 3, word="Mine")
    # a link in place of an output the old manifest lists, and one under a name this run writes
    (out / "part-0.parquet").unlink()
    (out / "part-0.parquet").symlink_to(precious)
    before = snapshot(tmp_path / "precious")
    rc, _, err = run(job, capsys, "--restart")
    assert rc == 2 and "part-0.parquet is not an output batchgen wrote (a symbolic link)" in err, err
    assert snapshot(tmp_path / "precious") == before
    assert (out / "part-1.parquet").is_file()  # refused before anything was deleted
    # a plain file of the user's under an output name no manifest lists: refused too, and kept
    (out / "part-0.parquet").unlink()
    (out / "manifest.json").unlink()
    write_shard(out / "part-0.parquet", 0, 2, word="Mine")
    mine = snapshot(out)["part-0.parquet"]
    rc, _, err = run(job, capsys, "--restart")
    assert rc == 2 and "is not an output batchgen wrote (other contents)" in err, err
    assert snapshot(out)["part-0.parquet"] == mine


def test_a_symlinked_output_is_never_adopted(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = good_job(tmp_path, model_dir)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    out = tmp_path / "out"
    (out / "part-0.parquet").rename(tmp_path / "moved.parquet")
    (out / "part-0.parquet").symlink_to(tmp_path / "moved.parquet")
    rc, _, err = run(job, capsys)
    assert rc == 2 and "part-0.parquet is a symbolic link" in err, err


def test_restart_of_a_named_output_leaves_the_folders_other_files(tmp_path: Path) -> None:
    folder = JobFolder.for_output_file(tmp_path / "b.jsonl")
    theirs = tmp_path / "a.jsonl"
    theirs.write_text(json.dumps({"id": "batch_req_1", "custom_id": "x", "response": None, "error": None}) + "\n")
    (tmp_path / "a.parquet").write_bytes(b"not ours either")
    open_manifest(folder, {"job": 1}, ["b.jsonl"], restart=True, job_time="2026-12-01T00:00:00")
    assert theirs.is_file() and (tmp_path / "a.parquet").is_file()
    assert (tmp_path / "b.jsonl.manifest.json").is_file() and not (tmp_path / "manifest.json").exists()


def test_restart_never_deletes_an_input_reached_under_another_name(tmp_path: Path) -> None:
    # Chained jobs: this job's input is an earlier job's output, and the output folder holds it
    # under another name (a hard link here; a bind mount or another spelling of the path on a
    # case-insensitive file system alike). The path differs, the file is the same: before the
    # (device, inode) comparison, --restart deleted the input as one of its own old outputs.
    line = {"id": "batch_req_1", "custom_id": "x", "response": None, "error": None}
    source = tmp_path / "in" / "a.jsonl"
    source.parent.mkdir()
    source.write_text(json.dumps(line) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(source, out / "a.jsonl")
    folder = JobFolder.for_output_file(out / "a.jsonl")
    open_manifest(folder, {"job": 1}, ["a.jsonl"], restart=True, job_time="2026-12-01T00:00:00", inputs=[source])
    assert source.read_text() == json.dumps(line) + "\n" and (out / "a.jsonl").is_file()


@pytest.mark.timeout(60)
def test_restart_passes_a_fifo_named_like_a_shard_without_opening_it(tmp_path: Path) -> None:
    # The folder scan for old outputs opened every *.parquet before checking what it is: a FIFO
    # blocked the open forever. It is not a regular file, so it is neither read nor deleted.
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "pipe.parquet")
    open_manifest(JobFolder(out), {"job": 1}, ["part-0.parquet"], restart=True, job_time="2026-12-01T00:00:00")
    assert (out / "pipe.parquet").exists() and (out / "manifest.json").is_file()


# --- reserved names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["timeline.parquet", "old.timeline.parquet"])
def test_an_input_whose_output_would_take_a_side_file_name_is_refused(
    tmp_path: Path, name: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the output shard timeline.parquet was overwritten by the timeline after its commit.
    write_shard(tmp_path / "in" / name, 0, 3)
    job = write_job(tmp_path / "job.yaml", job_data(model_dir))
    rc, _, err = run(job, capsys)
    assert rc == 2 and "batchgen keeps its own files under this name" in err, err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_request_file_whose_parquet_output_would_take_the_timeline_is_refused(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The other form of the collision: timeline.jsonl read as requests, written as Parquet.
    _requests(tmp_path / "in" / "timeline.jsonl", ["Once", "Twice"])
    data = job_data(model_dir)
    data["input"] = {"path": "in/timeline.jsonl", "format": "openai_jsonl", "batch_rows": 4}
    job = write_job(tmp_path / "job.yaml", data)
    rc, _, err = run(job, capsys)
    assert rc == 2 and "batchgen keeps its own files under this name" in err, err
    assert not (tmp_path / "out" / "timeline.parquet").exists()


def _requests(path: Path, prompts: list[str]) -> Path:
    lines = [
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                    "body": {"prompt": p, "max_tokens": 2, "temperature": 0}})
        for i, p in enumerate(prompts)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _batch(requests: Path, output: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    rc, _, err = run_main(
        ["run-batch", "-i", str(requests), "-o", str(output), "--model", str(model_dir), "--quiet",
         "--max-num-seqs", "4", "--max-model-len", "96", *extra],
        capsys,
    )
    return rc, err


@pytest.mark.parametrize("name", ["summary.json", "manifest.json", "results.jsonl.summary.json"])
def test_run_batch_to_a_side_file_name_is_refused_before_anything_is_written(
    tmp_path: Path, name: str, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: `-o summary.json` committed the responses, then overwrote them with the summary,
    # and the manifest marked the shard done, so reruns skipped it.
    requests = _requests(tmp_path / "requests.jsonl", ["Once", "Twice"])
    rc, err = _batch(requests, tmp_path / name, model_dir, capsys)
    assert rc == 2 and "batchgen keeps its own files under this name" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.jsonl"]


def test_two_batches_share_a_folder_and_a_users_summary_is_untouched(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "summary.json").write_text("the user's own\n")
    first = _requests(tmp_path / "first.jsonl", ["Once"])
    second = _requests(tmp_path / "second.jsonl", ["Twice", "Thrice"])
    rc, err = _batch(first, tmp_path / "first.out.jsonl", model_dir, capsys)
    assert rc == 0, err
    # before: refused as stale (the folder's manifest was the first batch's), and the suggested
    # --restart deleted the first batch's responses
    rc, err = _batch(second, tmp_path / "second.out.jsonl", model_dir, capsys)
    assert rc == 0, err
    assert (tmp_path / "summary.json").read_text() == "the user's own\n"
    assert len((tmp_path / "first.out.jsonl").read_text().splitlines()) == 1
    assert len((tmp_path / "second.out.jsonl").read_text().splitlines()) == 2
    rc, err = _batch(second, tmp_path / "second.out.jsonl", model_dir, capsys, "--restart")
    assert rc == 0, err
    assert len((tmp_path / "first.out.jsonl").read_text().splitlines()) == 1  # not the second's to delete
    for name in ("first.out.jsonl", "second.out.jsonl"):
        manifest = json.loads((tmp_path / f"{name}.manifest.json").read_text())
        assert list(manifest["shards"]) == [name]


def test_run_batch_refuses_a_request_file_that_is_one_of_its_side_files(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = _requests(tmp_path / "out.jsonl.summary.json", ["Once"])
    before = requests.read_bytes()
    rc, err = _batch(requests, tmp_path / "out.jsonl", model_dir, capsys)
    assert rc == 2 and "is the input file" in err, err
    assert requests.read_bytes() == before


def test_run_batch_refuses_an_output_that_is_a_hard_link_of_its_request_file(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = _requests(tmp_path / "requests.jsonl", ["Once"])
    os.link(requests, tmp_path / "same.jsonl")  # another name, the same inode (defect 8)
    before = requests.read_bytes()
    rc, err = _batch(requests, tmp_path / "same.jsonl", model_dir, capsys)
    assert rc == 2 and "is the input file" in err, err
    assert requests.read_bytes() == before


# --- the report of a job with response files as outputs (defect 12) ----------------------------

def test_a_job_with_response_file_outputs_writes_its_report_and_exits_0(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = _requests(tmp_path / "in" / "requests.jsonl", ["Once", "Twice"])
    with requests.open("a") as handle:
        handle.write('{"custom_id": "broken", "body": \n')
    data = job_data(model_dir, input={"path": "in", "format": "openai_jsonl"}, output={"path": "out", "format": "openai_jsonl"})
    data["max_error_rate"] = 1.0
    job = write_job(tmp_path / "job.yaml", data)
    rc, out, err = run(job, capsys)
    assert rc == 0, err  # before: exit 1, the report opened requests.jsonl as Parquet
    assert "report" in out
    page = (tmp_path / "out" / "report.html").read_text()
    assert "invalid_json" in page and "not valid JSON" in page


def test_the_report_of_a_run_batch_is_named_after_its_output(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = _requests(tmp_path / "requests.jsonl", ["Once"])
    with requests.open("a") as handle:
        handle.write("not json\n")
    out = tmp_path / "results.jsonl"
    rc, err = _batch(requests, out, model_dir, capsys)
    assert rc == 0, err
    rc, printed, err = run_main(["report", str(out)], capsys)
    assert rc == 0, err
    page = tmp_path / "results.jsonl.report.html"
    assert printed.splitlines()[0] == str(page)
    assert "invalid_json" in page.read_text()
    assert not (tmp_path / "report.html").exists()


def test_pending_records_round_trip_and_clear_on_commit(tmp_path: Path) -> None:
    from batchgen.io import InputIdentity

    manifest = Manifest.create(tmp_path, {"job": 1}, job_time="2026-12-01T00:00:00", name="r.jsonl.manifest.json")
    identity = InputIdentity("/x/requests.jsonl", 10, 2, "ab" * 32)
    manifest.mark_pending("r.jsonl", identity)
    loaded = Manifest.load(tmp_path, name="r.jsonl.manifest.json")
    assert loaded is not None and loaded.pending() == {"r.jsonl": identity}
    with pytest.raises(ValueError, match="not a plain output file name"):
        manifest.mark_pending("../r.jsonl", identity)
