"""generation_config.json of a Hugging Face folder: its EOS ids join config.json's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batchgen.models.checkpoint import load_checkpoint
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def folder(tiny: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / "model"))


def test_generation_config_eos_ids_are_added(folder: Path) -> None:
    base = load_checkpoint(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2], "do_sample": True}))
    loaded = load_checkpoint(folder)
    assert set(loaded.config.eos_token_ids) == {*base.config.eos_token_ids, 7, 2}
    assert len(set(loaded.config.eos_token_ids)) == len(loaded.config.eos_token_ids)
    assert loaded.fingerprint != base.fingerprint  # it changes what is generated
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert set(load_checkpoint(folder).config.eos_token_ids) == {*base.config.eos_token_ids, 9}


@pytest.mark.parametrize("content", ['{"eos_token_id": "x"}', '{"eos_token_id": [-1]}', "[1]", "{not json"])
def test_bad_generation_config_names_the_file(folder: Path, content: str) -> None:
    (folder / "generation_config.json").write_text(content)
    with pytest.raises(ValueError, match="generation_config.json"):
        load_checkpoint(folder)
