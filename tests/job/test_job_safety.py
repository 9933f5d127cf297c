"""`batchgen run`: the user's data is never deleted and a resume never adopts wrong outputs.

- an output folder that equals, contains or lies inside the input set is refused (exit 2) before
  anything is deleted, `--restart` included;
- the output folder is locked for a whole run; a live holder is named, a dead one's lock is
  taken over;
- each input shard's identity and the configuration fingerprint are in the manifest and in
  each output file: another dataset under the same names, an edited shard, or a foreign
  output file is refused, naming the shard;
- `--restart` removes every output the old manifest lists and every batchgen output in the
  folder, also when the manifest is corrupt, and leaves other files alone;
- the model fingerprint is by content (touching or rewriting the same bytes resumes);
- chat templates' `strftime_now` sees the job's pinned time on every resume.

In-process through `batchgen.cli.main.main` with one tiny model, except the lock holders, which
are separate processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from tests.job.helpers import file_state, final_shards, read_outputs, temp_files, write_job
from tests.tiny_models import make_tiny_hf_folder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(
        tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64
    )


def job_data(model: Path | str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": str(model),
        "input": {"path": "in", "batch_rows": 4},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 3, "temperature": 0.7},
        "engine": {"device": "cpu", "max_model_len": 128, "max_num_seqs": 8},
    }
    data.update(changes)
    return data


def write_shard(path: Path, first_id: int, num_rows: int, word: str = "Prompt") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = list(range(first_id, first_id + num_rows))
    pq.write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "prompt": [f"{word} {i}" for i in ids]}), path
    )
    return path


def run_main(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except (Exception, SystemExit) as exc:
        out, err = capsys.readouterr()
        pytest.fail(f"main raised {exc!r} (a user would see a traceback)\n{out}\n{err}")
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def run(job: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return run_main(["run", str(job), "--quiet", *extra], capsys)


def snapshot(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under `folder` (recursively) with its content hash, mtime and inode; the lock
    file is left out (each run that takes the lock writes its pid into it)."""
    return {
        str(p.relative_to(folder)): file_state(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".batchgen.lock"
    }


def good_job(tmp_path: Path, model: Path, **changes: Any) -> Path:
    write_shard(tmp_path / "in" / "part-0.parquet", 0, 6)
    write_shard(tmp_path / "in" / "part-1.parquet", 100, 5)
    return write_job(tmp_path / "job.yaml", job_data(model, **changes))


# --- output folder vs input set --------------------------------------------------------------


OVERLAPS: dict[str, tuple[str, str, str]] = {
    # name: (input.path, output.path, the relation named in the message)
    "output-is-the-input-folder": ("in", "in", "is the input"),
    "output-contains-the-input-folder": ("data/in", "data", "contains"),
    "output-inside-the-input-folder": ("in", "in/out", "lies inside"),
    "output-inside-a-recursive-glob": ("in/**/*.parquet", "in/sub/out", "lies inside"),
    "output-is-a-file-input-s-folder": ("in/part-0.parquet", "in", "contains the input"),
}


@pytest.mark.parametrize("case", list(OVERLAPS))
@pytest.mark.parametrize("restart", [False, True])
def test_output_folder_overlapping_the_inputs_is_refused_before_anything_changes(
    case: str, restart: bool, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    input_spec, output_spec, relation = OVERLAPS[case]
    folder = tmp_path / ("data/in" if input_spec.startswith("data") else "in")
    write_shard(folder / "part-0.parquet", 0, 4)
    write_shard(folder / "part-1.parquet", 10, 4)
    if "glob" in case:
        write_shard(folder / "sub" / "part-2.parquet", 20, 4)
    job = write_job(
        tmp_path / "job.yaml",
        job_data(model_dir, input={"path": input_spec}, output={"path": output_spec}),
    )
    before = snapshot(tmp_path)
    rc, out, err = run(job, capsys, *(["--restart"] if restart else []))
    assert rc == 2, err
    assert out == ""
    assert "output.path" in err and relation in err and "outside the input set" in err
    assert snapshot(tmp_path) == before  # no input deleted, nothing written


# --- the lock ---------------------------------------------------------------------------------

_HOLDER = (
    "import sys; from pathlib import Path; from batchgen.io import OutputLock; "
    "lock = OutputLock(Path(sys.argv[1])); lock.acquire(); print('locked', flush=True); "
    "sys.stdin.read()"
)


def _start_holder(out_dir: Path) -> subprocess.Popen[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out_dir)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_run_on_a_locked_folder_is_refused_naming_the_holder(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = good_job(tmp_path, model_dir)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    out_dir = tmp_path / "out"
    holder = _start_holder(out_dir)
    try:
        before = snapshot(out_dir)
        for extra in ([], ["--restart"]):
            rc, _, err = run(job, capsys, *extra)
            assert rc == 2, err
            assert f"pid {holder.pid}" in err and str(out_dir) in err and "in use" in err
            assert snapshot(out_dir) == before  # the holder's files untouched
    finally:
        holder.kill()
        holder.communicate()  # waits and closes the pipes


def test_a_lock_left_by_a_killed_run_is_taken_over(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = good_job(tmp_path, model_dir)
    holder = _start_holder(tmp_path / "out")
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()  # waits and closes the pipes
    assert holder.returncode == -signal.SIGKILL
    assert (tmp_path / "out" / ".batchgen.lock").read_text().strip() == str(holder.pid)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    assert sorted(read_outputs(tmp_path / "out")) == ["part-0.parquet", "part-1.parquet"]


# --- input identity and fingerprint of each shard ---------------------------------------------


def _committed(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    job = good_job(tmp_path, model_dir)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    return job


def test_manifest_and_output_files_record_the_input_identity(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from batchgen.io import fingerprint_digest, inspect_shard, read_shard_metadata
    from batchgen.io.schema import ColumnMap

    _committed(tmp_path, model_dir, capsys)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    digest = fingerprint_digest(manifest["fingerprint"])
    for name in ("part-0.parquet", "part-1.parquet"):
        info = inspect_shard(tmp_path / "in" / name, ColumnMap(id="id", prompt="prompt"))
        record = manifest["shards"][name]
        assert record["input_path"] == str(tmp_path / "in" / name)
        assert record["input_size"] == (tmp_path / "in" / name).stat().st_size
        assert record["input_footer_hash"] == info.footer_hash
        assert record["num_input_rows"] == info.num_rows
        metadata = read_shard_metadata(tmp_path / "out" / name)
        assert metadata == (digest, info.identity())


def _same_name_other_data(tmp_path: Path) -> None:
    write_shard(tmp_path / "in" / "part-1.parquet", 100, 5, word="Another")


def _edited_in_place(tmp_path: Path) -> None:
    table = pq.read_table(tmp_path / "in" / "part-1.parquet")
    pq.write_table(table.slice(0, 4), tmp_path / "in" / "part-1.parquet")


def _other_folder_same_names(tmp_path: Path) -> None:
    write_shard(tmp_path / "in2" / "part-0.parquet", 0, 6)
    write_shard(tmp_path / "in2" / "part-1.parquet", 500, 5)
    job = tmp_path / "job.yaml"
    data = json.loads(json.dumps(__import__("yaml").safe_load(job.read_text())))
    data["input"]["path"] = "in2"
    write_job(job, data)


INPUT_CHANGES = {
    "same-name-other-data": _same_name_other_data,
    "shard-edited-in-place": _edited_in_place,
    "other-folder-same-names": _other_folder_same_names,
}


@pytest.mark.parametrize("change", list(INPUT_CHANGES))
def test_resume_refuses_outputs_of_other_input_data_naming_the_shard(
    change: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _committed(tmp_path, model_dir, capsys)
    out_dir = tmp_path / "out"
    # part-0 is still to do (its file is gone); part-1 is committed, from the old data.
    (out_dir / "part-0.parquet").unlink()
    INPUT_CHANGES[change](tmp_path)
    before = snapshot(out_dir)
    rc, _, err = run(job, capsys)
    assert rc == 2, err
    assert "part-1.parquet" in err and "another input" in err and "--restart" in err
    assert snapshot(out_dir) == before


def test_a_foreign_output_file_is_not_adopted(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file under an output shard's name that the manifest does not list (what a run killed
    # after its rename leaves) is adopted only if its metadata says it is this job's.
    job = _committed(tmp_path, model_dir, capsys)
    out_dir = tmp_path / "out"
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "in", other / "in")
    write_job(other / "job.yaml", job_data(model_dir, sampling={"max_tokens": 2}))
    rc, _, err = run(other / "job.yaml", capsys)
    assert rc == 0, err
    manifest = json.loads((out_dir / "manifest.json").read_text())
    del manifest["shards"]["part-1.parquet"]
    (out_dir / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(other / "out" / "part-1.parquet", out_dir / "part-1.parquet")
    before = snapshot(out_dir)
    rc, _, err = run(job, capsys)
    assert rc == 2, err
    assert "part-1.parquet" in err and "another configuration" in err
    assert snapshot(out_dir) == before


def test_a_committed_shard_replaced_by_another_jobs_output_is_refused(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _committed(tmp_path, model_dir, capsys)
    out_dir = tmp_path / "out"
    pq.write_table(pq.read_table(out_dir / "part-0.parquet").replace_schema_metadata(None), out_dir / "part-0.parquet")
    rc, _, err = run(job, capsys)
    assert rc == 2, err
    assert "part-0.parquet" in err and "not written by batchgen" in err


# --- --restart --------------------------------------------------------------------------------


def test_restart_removes_every_listed_and_every_batchgen_output_even_with_a_corrupt_manifest(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _committed(tmp_path, model_dir, capsys)
    out_dir = tmp_path / "out"
    # The inputs were renamed since: the old outputs are named after no input of today.
    for name in ("part-0", "part-1"):
        (tmp_path / "in" / f"{name}.parquet").rename(tmp_path / "in" / f"new-{name}.parquet")
    # A file of other origin in the folder stays.
    foreign = write_shard(out_dir / "notes.parquet", 0, 2, word="Mine")
    foreign_state = file_state(foreign)
    rc, _, err = run(job, capsys)
    assert rc == 2 and "not among this job's inputs" in err, err
    (out_dir / "manifest.json").write_text("{corrupt")
    rc, _, err = run(job, capsys)
    assert rc == 2 and "not a valid batchgen manifest" in err and "--restart" in err, err
    rc, _, err = run(job, capsys, "--restart")
    assert rc == 0, err
    assert [p.name for p in final_shards(out_dir)] == [
        "new-part-0.parquet",
        "new-part-1.parquet",
        "notes.parquet",
    ]
    assert file_state(foreign) == foreign_state
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["new-part-0.parquet", "new-part-1.parquet"]
    assert temp_files(out_dir) == []


def test_restart_removes_shards_listed_by_the_old_manifest(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _committed(tmp_path, model_dir, capsys)
    out_dir = tmp_path / "out"
    # An output listed in the manifest but without batchgen metadata (an older version's).
    pq.write_table(pq.read_table(out_dir / "part-1.parquet").replace_schema_metadata(None), out_dir / "part-1.parquet")
    (tmp_path / "in" / "part-1.parquet").unlink()
    rc, _, err = run(job, capsys, "--restart")
    assert rc == 0, err
    assert [p.name for p in final_shards(out_dir)] == ["part-0.parquet"]


# --- model fingerprint by content -------------------------------------------------------------


def test_model_fingerprint_is_by_content_not_by_modification_time(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    job = good_job(tmp_path, model)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    (tmp_path / "out" / "part-1.parquet").unlink()
    # A reinstall: the same bytes, written again, later.
    for path in model.iterdir():
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
        os.utime(path, (1_000_000_000, 1_000_000_000))
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    # A copy elsewhere, the job pointed at it: the same model.
    copy = tmp_path / "model-copy"
    shutil.copytree(model, copy)
    (tmp_path / "out" / "part-1.parquet").unlink()
    rc, _, err = run(job, capsys, "--set", f"model={copy}")
    assert rc == 0, err
    # One changed byte, same size: refused.
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    rc, _, err = run(job, capsys)
    assert rc == 2, err
    assert "model.fingerprint" in err


# --- the pinned time of chat templates --------------------------------------------------------


class _Clock:
    """A stand-in for `datetime` whose now() is set by the test."""

    current = datetime(2026, 1, 1, 9, 30)

    @classmethod
    def now(cls) -> datetime:
        return cls.current

    @staticmethod
    def fromisoformat(text: str) -> datetime:
        return datetime.fromisoformat(text)


def test_strftime_now_is_pinned_per_job_and_reused_on_resume(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import batchgen.job.run
    import batchgen.tokenizer.chat_template

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    (model / "chat_template.jinja").write_text(
        "Today is {{ strftime_now('%d %B %Y') }}.\n"
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    for shard, first in (("part-0.parquet", 0), ("part-1.parquet", 10)):
        messages = [[{"role": "user", "content": f"Question {i}"}] for i in range(first, first + 4)]
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(
            pa.table({"id": pa.array(range(first, first + 4), pa.int64()), "messages": messages}),
            tmp_path / "in" / shard,
        )
    job = write_job(
        tmp_path / "job.yaml",
        job_data(model, input={"path": "in", "columns": {"id": "id", "messages": "messages"}}),
    )
    monkeypatch.setattr(batchgen.job.run, "datetime", _Clock)
    monkeypatch.setattr(batchgen.tokenizer.chat_template, "datetime", _Clock)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    out_dir = tmp_path / "out"
    first_run = read_outputs(out_dir)
    assert json.loads((out_dir / "manifest.json").read_text())["job_time"] == "2026-01-01T09:30:00"

    (out_dir / "part-1.parquet").unlink()  # to be generated again, in May
    _Clock.current = datetime(2026, 5, 1, 9, 30)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    again = read_outputs(out_dir)["part-1.parquet"]
    # "01 January 2026" and "01 May 2026" tokenize to different lengths: equal prompt token
    # counts and outputs mean the prompt was rendered at the pinned time.
    for key in ("prompt_tokens", "completion_tokens"):
        assert [u[key] for u in again.column("usage").to_pylist()] == [
            u[key] for u in first_run["part-1.parquet"].column("usage").to_pylist()
        ]
    assert again.column("output").equals(first_run["part-1.parquet"].column("output"))
    assert json.loads((out_dir / "manifest.json").read_text())["job_time"] == "2026-01-01T09:30:00"


# --- resume refusal over everything that changes outputs --------------------------------------


def _flip_last_weight_byte(model: Path, job: Path) -> list[str]:
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    return []


def _other_bos_token(model: Path, job: Path) -> list[str]:
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["bos_token"] = "<|im_end|>"
    config_file.write_text(json.dumps(config))
    return []


def _other_chat_template(model: Path, job: Path) -> list[str]:
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    return []


REFUSALS: dict[str, tuple[Any, str]] = {
    # name: (a change to the model folder and job returning extra CLI args, the key named)
    "model-file": (_flip_last_weight_byte, "model.fingerprint"),
    "tokenizer": (_other_bos_token, "tokenizer.fingerprint"),
    "chat-template": (_other_chat_template, "tokenizer.fingerprint"),
    "seed": (lambda model, job: ["--set", "seed=5"], "job.seed: 0 -> 5"),
    "columns": (
        lambda model, job: ["--set", "input.columns={id: id, prompt: prompt, passthrough: [prompt]}"],
        "job.columns.passthrough",
    ),
    "prompt-too-long": (
        lambda model, job: ["--set", "prompt_too_long=truncate_left"],
        "job.prompt_too_long: 'error' -> 'truncate_left'",
    ),
}


@pytest.mark.parametrize("change", list(REFUSALS))
def test_resume_is_refused_for_every_change_of_output(
    change: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    job = good_job(tmp_path, model)
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    (tmp_path / "out" / "part-1.parquet").unlink()  # work left to do
    before = snapshot(tmp_path / "out")
    modify, named = REFUSALS[change]
    extra = modify(model, job)
    rc, out, err = run(job, capsys, *extra)
    assert rc == 2, err
    assert out == ""
    assert named in err and "--restart" in err
    assert snapshot(tmp_path / "out") == before
    rc, _, err = run(job, capsys, *extra, "--restart")
    assert rc == 0, err
