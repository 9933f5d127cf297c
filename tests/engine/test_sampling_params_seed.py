"""`SamplingParams.with_seed`: what `replace(seed=...)` gives, validating only the seed."""

from __future__ import annotations

import dataclasses

import pytest

from batchgen.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(n=3, max_tokens=7, temperature=0.7, top_p=0.9, top_k=5, seed=4, stop=["x"],
                       stop_token_ids=[3], logprobs=2, logit_bias={1: 2.0}, bad_words=["no"],
                       structured_outputs={"choice": ["a", "b"]}),
    ],
)
@pytest.mark.parametrize("seed", [None, 0, -5, 2**63 - 1])
def test_with_seed_equals_replace(params: SamplingParams, seed: int | None) -> None:
    copy = params.with_seed(seed)
    assert copy == params.replace(seed=seed)
    assert copy.seed == seed
    assert all(getattr(copy, f.name) is getattr(params, f.name) for f in dataclasses.fields(params) if f.name != "seed")
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 1.5, "3", True])
def test_with_seed_refuses_what_replace_refuses(seed: object) -> None:
    with pytest.raises(ValueError):
        SamplingParams().replace(seed=seed)
    with pytest.raises(ValueError):
        SamplingParams().with_seed(seed)  # type: ignore[arg-type]
