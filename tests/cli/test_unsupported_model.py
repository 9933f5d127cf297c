"""`batchgen run job.yaml` on a model batchgen does not support (issue 23).

The job stops at load with exit code 2 and one message on stderr, nothing written: for an
architecture batchgen lacks, the message names it (class name and model_type, or model_type
alone when config.json has no `architectures`) and lists the supported ones; for a rope type it
lacks, a key it does not know, or a feature flag at a value it does not implement, the message
names the file and that field. The model folders are copies of one tiny Llama whose config.json
is edited, so everything else about them loads.

Runs in-process through `batchgen.cli.main.main`, as tests/job/test_job_errors.py does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.models.config import ROPE_TYPES, SUPPORTED_ARCHITECTURES
from batchgen.models.hf_config import HF_ARCHITECTURES
from tests.job.helpers import final_shards, write_job
from tests.tiny_models import make_tiny_hf_folder

Edit = Callable[[dict[str, Any]], None]
SUPPORTED = [*HF_ARCHITECTURES, *SUPPORTED_ARCHITECTURES]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_heads=4, num_kv_heads=2)


def _falcon(config: dict[str, Any]) -> None:
    config.update(architectures=["FalconForCausalLM"], model_type="falcon")


def _model_type_only(config: dict[str, Any]) -> None:
    del config["architectures"]
    config["model_type"] = "falcon"


def _unknown_rope_type(config: dict[str, Any]) -> None:
    config["rope_parameters"] = {"rope_type": "su", "factor": 4.0, "rope_theta": 10000.0}


def _unknown_legacy_rope_type(config: dict[str, Any]) -> None:
    config["rope_scaling"] = {"type": "dynamic-yarn", "factor": 4.0}


def _unknown_rope_key(config: dict[str, Any]) -> None:
    config["rope_parameters"] = {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0,
        "alpha": 2.0,
    }  # fmt: skip


def _flag_not_neutral(config: dict[str, Any]) -> None:
    config["mlp_bias"] = True


def _unknown_key(config: dict[str, Any]) -> None:
    config["attn_temperature_tuning"] = True  # Llama 4's, unknown to a Llama 3 reader


# case -> (edit of config.json, strings the one error message must contain)
CASES: dict[str, tuple[Edit, list[str]]] = {
    "architecture": (_falcon, ["unsupported architecture", "FalconForCausalLM", "'falcon'", *SUPPORTED]),
    "model-type-only": (_model_type_only, ["unsupported architecture", "model_type='falcon'", *SUPPORTED]),
    "rope-type": (_unknown_rope_type, ["rope_parameters", "'su'", "not supported", *ROPE_TYPES]),
    "legacy-rope-type": (_unknown_legacy_rope_type, ["rope_scaling", "'dynamic-yarn'", "not supported"]),
    "rope-key": (_unknown_rope_key, ["rope_parameters", "yarn", "'alpha'"]),
    "feature-flag": (_flag_not_neutral, ["mlp_bias=True", "not supported for llama"]),
    "unknown-key": (_unknown_key, ["'attn_temperature_tuning'", "not implemented for llama"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unsupported_model_fails_at_load_with_exit_2(
    case: str, llama_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, mentions = CASES[case]
    model = Path(shutil.copytree(llama_folder, tmp_path / "model"))
    config_file = model / "config.json"
    config = json.loads(config_file.read_text())
    edit(config)
    config_file.write_text(json.dumps(config))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["Hello there", "Tell me more"]}), tmp_path / "in" / "part-0.parquet")
    job = {
        "model": str(model), "input": {"path": "in"}, "output": {"path": "out"},
        "sampling": {"max_tokens": 4}, "engine": {"device": "cpu", "max_model_len": 64},
    }  # fmt: skip
    write_job(tmp_path / "job.yaml", job)

    rc = main(["run", str(tmp_path / "job.yaml"), "--quiet"])

    out, err = capsys.readouterr()
    assert rc == 2, err
    assert out == "" and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    for text in [str(config_file), *mentions]:
        assert text in errors[0], f"{text!r} not in {errors[0]!r}"
    assert not (tmp_path / "out").is_dir() or final_shards(tmp_path / "out") == []
