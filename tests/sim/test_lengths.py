"""Token sources of a simulation: filler tokens, recorded outputs by seed, length distributions."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.config import engine_configs
from batchgen.engine.sampling_params import SamplingParams
from batchgen.sim.engine import build_sim_engine, load_sim_model
from batchgen.sim.hardware import load_hardware
from batchgen.sim.lengths import (
    Filler,
    LengthDistribution,
    MaxTokens,
    Recorded,
    RecordedOutputs,
    read_bench_outputs,
    read_recorded_outputs,
)
from tests.tiny_models import smollm2_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def filler() -> Filler:
    return Filler.for_tokenizer(smollm2_tokenizer(), [EOS])


def test_filler_tokens_are_silent_special_tokens_that_differ_between_samples(filler: Filler) -> None:
    tok = smollm2_tokenizer()
    assert EOS not in filler.tokens and len(filler.tokens) == 16  # SmolLM2's 17 specials, less EOS
    assert tok.decode(list(filler.tokens)) == ""  # no stop string can match them
    a = [filler.token(11, i) for i in range(32)]
    b = [filler.token(12, i) for i in range(32)]
    assert a == [filler.token(11, i) for i in range(32)]  # a pure function of (seed, index)
    assert a[:16] != b[:16] and a[16:] != b[16:]  # two samples' blocks of 16 differ
    assert len(set(a)) > 4


@settings(max_examples=40)
@given(st.integers(0, 2**63 - 1), st.integers(1, 40))
def test_a_distribution_sample_stops_at_its_length(seed: int, count: int) -> None:
    lengths = list(range(1, count + 1))
    dist = LengthDistribution(lengths, filler=Filler((5, 6, 7)), eos=EOS)
    n = dist.length(seed)
    assert n in lengths
    tokens = [dist.token(seed, i) for i in range(n)]
    assert tokens[-1] == EOS and EOS not in tokens[:-1]


def test_a_distribution_draws_every_length() -> None:
    dist = LengthDistribution([3, 50, 400], filler=Filler((5,)), eos=EOS)
    drawn = [dist.length(s) for s in range(3000)]
    assert {n: drawn.count(n) for n in (3, 50, 400)} == pytest.approx({3: 1000, 50: 1000, 400: 1000}, rel=0.1)
    with pytest.raises(ValueError):
        LengthDistribution([], filler=Filler((5,)), eos=EOS)


def test_a_step_of_tokens_is_each_token(filler: Filler) -> None:
    # `tokens` (a step's decodes at once) draws what `token` draws, for every kind of source;
    # the filler's values are splitmix64's finalizer over seed * 2**32 + index (mod 2**64).
    def splitmix_finalizer(x: int) -> int:
        mask = 2**64 - 1
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    for seed, index in [(12345, 7), (2**63 - 1, 0), (-5, 3), (2**64 - 1, 2**31), (-(2**63), 2**40), (2**70 + 3, 1)]:
        expected = filler.tokens[splitmix_finalizer(((seed << 32) + index) & (2**64 - 1)) % len(filler.tokens)]
        assert filler.token(seed, index) == expected  # one pair: plain integers
        assert filler.tokens_of([seed], [index]) == [expected]  # as arrays
    with pytest.raises(ValueError, match="start at 0"):
        filler.token(5, -1)
    recorded = RecordedOutputs({5: Recorded((9, 8), 4, True), 6: Recorded(None, 3, False)}, filler=filler, eos=EOS)
    sources = [MaxTokens(filler), LengthDistribution([1, 2, 3, 9], filler=filler, eos=EOS), recorded]
    seeds = [5, 6, 7, 3, 2**64 - 1] * 8
    indices = [i % 6 for i in range(len(seeds))]
    for source in sources:
        assert source.tokens(seeds, indices) == [source.token(s, i) for s, i in zip(seeds, indices, strict=True)]
        assert source.tokens([], []) == []
    dist = sources[1]
    assert EOS in dist.tokens(seeds, indices)  # some samples end within 6 tokens, others do not
    assert any(t != EOS for t in dist.tokens(seeds, indices))
    for source in sources[:2]:  # the array forms refuse what the hash cannot mean
        with pytest.raises(ValueError, match="indices"):
            source.tokens([5, 6], [0])
        with pytest.raises(ValueError, match="start at 0"):
            source.tokens([5, 6], [0, -1])


def test_recorded_outputs_replay_tokens_then_lengths(filler: Filler) -> None:
    recorded = RecordedOutputs(
        {1: Recorded((9, 8, EOS), 3, True), 2: Recorded(None, 4, True), 3: Recorded(None, 2, False)},
        filler=filler, eos=EOS,
    )
    assert [recorded.token(1, i) for i in range(3)] == [9, 8, EOS]
    assert [recorded.token(2, i) for i in range(4)] == [filler.token(2, 0), filler.token(2, 1), filler.token(2, 2), EOS]
    assert EOS not in [recorded.token(3, i) for i in range(6)]  # ran to its limit: no EOS
    assert recorded.token(99, 0) == filler.token(99, 0) and recorded.num_unknown_seeds == 1
    assert MaxTokens(filler).token(5, 3) == filler.token(5, 3)


def _shard(path: Path, seeds: list[int], reasons: list[str], counts: list[int]) -> Path:
    usage = pa.struct([("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("cached_tokens", pa.int32())])
    pq.write_table(pa.table({
        "id": pa.array(range(len(seeds)), pa.int64()),
        "finish_reason": pa.array(reasons),
        "usage": pa.array([{"prompt_tokens": 5, "completion_tokens": c, "cached_tokens": 0} for c in counts], usage),
        "seed": pa.array(seeds, pa.int64()),
    }), path)
    return path


def test_reading_output_shards_by_seed(tmp_path: Path) -> None:
    a = _shard(tmp_path / "a.parquet", [1, 2, 3], ["stop", "length", "error"], [4, 7, 0])
    outputs = read_recorded_outputs([a])
    assert outputs == {1: Recorded(None, 4, True), 2: Recorded(None, 7, False)}  # the error row left out
    same = _shard(tmp_path / "b.parquet", [1], ["stop"], [4])
    assert read_recorded_outputs([a, same]) == outputs  # one sample seen twice: the same output
    clash = _shard(tmp_path / "c.parquet", [1], ["stop"], [5])
    with pytest.raises(ValueError, match="seed 1 names two samples"):
        read_recorded_outputs([a, clash])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="not a batchgen output shard"):
        read_recorded_outputs([tmp_path / "d.parquet"])


def test_bench_outputs_are_keyed_by_the_seeds_the_engine_gives_its_requests(tmp_path: Path) -> None:
    path = tmp_path / "outputs.jsonl"
    recorded = [[11, 12, 13], [21, EOS], [31]]
    path.write_text("".join(f'{{"request_id": "r{k}", "token_ids": {ids}}}\n' for k, ids in enumerate(recorded)))
    outputs = read_bench_outputs(path)
    model = load_sim_model(None)
    tokens = RecordedOutputs(outputs, filler=Filler.for_tokenizer(model.tokenizer, [EOS]), eos=EOS)
    sim = build_sim_engine(model, engine_configs({"max_num_seqs": 8}), load_hardware("h100-sxm"), tokens)
    for prompt in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
        sim.engine.add_request(prompt, SamplingParams(max_tokens=5, temperature=0))
    done = {}
    while sim.engine.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in sim.engine.step()})
    # each request replays its recorded ids; bench outputs count as stopped: then EOS
    assert done == {0: (11, 12, 13, EOS), 1: (21, EOS), 2: (31, EOS)}
    assert tokens.num_unknown_seeds == 0


def test_kept_lengths_are_bounded_and_the_draws_unchanged(filler: Filler, monkeypatch: pytest.MonkeyPatch) -> None:
    # A length is a function of its seed: emptying the kept ones (a million samples would stay)
    # changes no draw.
    seeds = [(s * 7919) % 10_007 for s in range(300)]
    indices = [s % 9 for s in seeds]
    unbounded = LengthDistribution([1, 2, 3, 9, 40], filler=filler, eos=EOS)
    expected = ([unbounded.length(s) for s in seeds], unbounded.tokens(seeds, indices))
    monkeypatch.setattr("batchgen.sim.lengths._MAX_KEPT_LENGTHS", 8)
    bounded = LengthDistribution([1, 2, 3, 9, 40], filler=filler, eos=EOS)
    for _ in range(2):
        assert ([bounded.length(s) for s in seeds], bounded.tokens(seeds, indices)) == expected
        assert [bounded.token(s, i) for s, i in zip(seeds, indices, strict=True)] == expected[1]
    assert len(bounded._by_seed) <= 8
    assert len(unbounded._by_seed) == len(set(seeds))
