"""A job's `chat:` section and `generate(chat=...)`: the options change the prompt tokens as the
tokenizer renders them, enter the fingerprint only when set (a resume with other options is
refused; a default job keeps its fingerprint), and a bad key or value names ``chat.<key>``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchgen
from batchgen.cli.main import main
from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.config import JobConfigError
from batchgen.job.config_file import job_config_from_dict
from batchgen.job.prepare import RowPreparer
from batchgen.tokenizer.chat_options import ChatOptions
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.job.helpers import read_outputs, write_job
from tests.tiny_models import make_tiny_hf_folder
from tests.tokenizer.test_chat_options import QWEN3_LIKE

OVERRIDE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Name a prime."}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi, I am"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"},
     {"role": "assistant", "content": "Because"}],
]
SILENT = {"template_kwargs": {"enable_thinking": False}}
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}
ENGINE = {"device": "cpu", "max_model_len": 128, "max_num_seqs": 4, "max_num_batched_tokens": 64}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose own template is Qwen3-like (chat_template.jinja comes first)."""
    folder = make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)
    (folder / "chat_template.jinja").write_text(QWEN3_LIKE, encoding="utf-8")
    return folder


def _expected_prompt_tokens(model: Path, chat: dict[str, Any] | None) -> list[int]:
    tok = Tokenizer.from_hf_folder(model)
    options = ChatOptions.from_mapping(chat or {})
    return [len(tok.encode_chat(c, options=options)) for c in CHATS]


def _job(folder: Path, model: Path, chat: dict[str, Any] | None = None, **extra: Any) -> Path:
    data = folder / "data"
    if not data.exists():
        data.mkdir(parents=True)
        pq.write_table(
            pa.table({"id": pa.array(range(len(CHATS)), pa.int64()), "conversation": CHATS}),
            data / "part-0.parquet",
        )
    return write_job(
        folder / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "data", "columns": {"messages": "conversation"}},
            "output": {"path": "out"},
            "sampling": {"max_tokens": 2, "temperature": 0},
            "engine": ENGINE,
            "report": False,
            **({} if chat is None else {"chat": chat}),
            **extra,
        },
    )


def _prompt_tokens(out: Path) -> list[int]:
    table = read_outputs(out)["part-0.parquet"]
    assert table.column("error").null_count == table.num_rows, table.column("error").to_pylist()
    return [u["prompt_tokens"] for u in table.column("usage").to_pylist()]


def test_chat_options_change_the_prompt_tokens_and_the_fingerprint(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counts: dict[str, list[int]] = {}
    fingerprints: dict[str, dict[str, Any]] = {}
    for name, chat in (("default", None), ("silent", SILENT), ("continue", CONTINUE),
                       ("override", {"template": OVERRIDE})):
        job = _job(tmp_path / name, model, chat)
        assert main(["run", str(job), "--quiet"]) == 0
        counts[name] = _prompt_tokens(tmp_path / name / "out")
        assert counts[name] == _expected_prompt_tokens(model, chat), name
        manifest = json.loads((tmp_path / name / "out" / "manifest.json").read_text())
        fingerprints[name] = manifest["fingerprint"]["job"]
    think = len(Tokenizer.from_hf_folder(model).encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    assert counts["silent"] == [n + think for n in counts["default"]]
    # continuing drops the end of turn and the generation prompt after the final message
    assert all(c < d for c, d in zip(counts["continue"], counts["default"], strict=True))
    assert counts["override"] != counts["default"]
    # the options are fingerprinted only when set
    assert "chat" not in fingerprints["default"]
    assert fingerprints["silent"]["chat"] == {
        "template_sha256": None,
        "template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": True,
        "continue_final_message": False,
    }
    assert fingerprints["continue"]["chat"]["continue_final_message"] is True
    assert len(fingerprints["override"]["chat"]["template_sha256"]) == 64
    assert {k: v for k, v in fingerprints["silent"].items() if k != "chat"} == fingerprints["default"]

    # A resume under other chat options is refused; the same options resume (nothing to do).
    default_job = tmp_path / "default" / "job.yaml"
    capsys.readouterr()
    assert main(["run", str(default_job), "--quiet", "--set", "chat.template_kwargs.enable_thinking=false"]) == 2
    err = capsys.readouterr().err
    assert "chat" in err and "enable_thinking" in err and "--restart" in err and "Traceback" not in err
    silent_job = tmp_path / "silent" / "job.yaml"
    assert main(["run", str(silent_job), "--quiet", "--set", "chat.template_kwargs.enable_thinking=true"]) == 2
    assert main(["run", str(silent_job), "--quiet"]) == 0
    assert main(["run", str(default_job), "--quiet", "--set", "chat.add_generation_prompt=true"]) == 0


def test_generate_applies_chat_options(model: Path) -> None:
    table = pa.table({"conversation": CHATS})
    common: dict[str, Any] = {"model": str(model), "messages_column": "conversation", "use_tqdm": False,
                              "sampling": {"max_tokens": 2, "temperature": 0}, **ENGINE}
    for chat in (None, SILENT, CONTINUE):
        result = batchgen.generate(table, chat=chat, **common)
        assert result.column("error").null_count == table.num_rows
        got = [u["prompt_tokens"] for u in result.column("usage").to_pylist()]
        assert got == _expected_prompt_tokens(model, chat), chat
    with pytest.raises(ValueError, match="unknown chat option"):
        batchgen.generate(table, chat={"enable_thinking": False}, **common)


def _config(chat: Any, **extra: Any) -> Any:
    return job_config_from_dict(
        {"input": {"path": "d"}, "output": {"path": "o"}, "chat": chat, **extra},
        source=Path("job.yaml"), base_dir=Path("."),
    )


def test_default_chat_options_keep_the_fingerprint() -> None:
    plain = job_config_from_dict(
        {"input": {"path": "d"}, "output": {"path": "o"}}, source=Path("job.yaml"), base_dir=Path(".")
    )
    assert "chat" not in plain.fingerprint_fields()
    explicit = _config({"template": None, "template_kwargs": {}, "add_generation_prompt": True,
                        "continue_final_message": False})
    assert explicit.chat == ChatOptions() and explicit.fingerprint_fields() == plain.fingerprint_fields()
    assert _config(None).fingerprint_fields() == plain.fingerprint_fields()
    assert _config(SILENT).chat == ChatOptions.create(template_kwargs={"enable_thinking": False})


@pytest.mark.parametrize(
    ("chat", "message"),
    [
        ({"tempalte": "x"}, "unknown key 'chat.tempalte' (did you mean 'chat.template'?)"),
        ({"enable_thinking": False}, "unknown key 'chat.enable_thinking'"),
        ({"add_generation_prompt": "no"}, "chat.add_generation_prompt: expected true or false"),
        ({"continue_final_message": True}, "chat.continue_final_message: expected add_generation_prompt false"),
        ({"template_kwargs": {"messages": []}}, "chat.template_kwargs: expected names the renderer does not set"),
        ({"template_kwargs": ["enable_thinking"]}, "chat.template_kwargs: expected a mapping"),
        ({"template": "tmpl.jinja"}, "chat.template: expected the text of a Jinja chat template"),
        ({"template": "{% if %}"}, "chat.template: expected a template that compiles"),
        ("yes", "chat: expected a mapping"),
    ],
)
def test_bad_chat_section_names_the_key(chat: Any, message: str) -> None:
    with pytest.raises(JobConfigError) as info:
        _config(chat)
    assert str(info.value).startswith("job.yaml: ") and message in str(info.value), str(info.value)


def test_bad_chat_section_exits_with_the_key(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, model, {"add_generation_prompt": False, "continue_final_message": "yes"})
    assert main(["run", str(job), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "chat.continue_final_message: expected true or false" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_score_takes_the_template_options_only() -> None:
    score = {"task": "score", "input": {"path": "d", "columns": {"prompt": "p", "completion": "c"}}}
    assert _config(SILENT, **score).chat.kwargs() == {"enable_thinking": False}
    for chat, key in ((CONTINUE, "chat.continue_final_message"), ({"add_generation_prompt": False}, "chat.add_generation_prompt")):
        with pytest.raises(JobConfigError, match=f"{key}: task score renders the prompt with the generation prompt"):
            _config(chat, **score)


def test_score_rows_render_their_prompt_with_the_template_options(model: Path) -> None:
    tok = Tokenizer.from_hf_folder(model)
    chats = [[*c[:-1], {"role": "assistant", "content": " a reply"}] for c in CHATS if len(c) > 1]
    ids: dict[str, list[int]] = {}
    for name, chat in (("default", None), ("silent", ChatOptions.from_mapping(SILENT))):
        preparer = RowPreparer(tok, SamplingParams(), max_model_len=128, prompt_too_long="error", job_seed=0,
                               now=datetime(2026, 1, 1), chat=chat)
        rows = preparer.prepare(0, 0, list(range(len(chats))), None, None, None, [() for _ in chats],
                                completions=chats)
        assert all(r.error is None and r.token_ids is not None for r in rows)
        ids[name] = [t for r in rows for t in (r.token_ids or ())]
        for row, c in zip(rows, chats, strict=True):
            assert row.score_from == len(tok.encode_chat(c[:-1], options=chat))
    assert len(ids["silent"]) > len(ids["default"])
