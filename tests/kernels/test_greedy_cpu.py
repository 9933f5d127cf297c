"""kernels/greedy_cpu.py: greedy tokens through the screen (bfloat16 or int8 estimates, the
candidates' float32 logits from the packed head or from the head's rows) equal the argmax of the
float32 LM head's logits (batchgen's kernel), on random, tied, near-tied and hostile rows; each
estimate's error bound holds where its format's rounding errors add up; undecided rows take the
full product."""

from __future__ import annotations

import pytest
import torch

from batchgen.kernels import argmax, greedy_cpu, linear, linear_cpu, pack_linear_weight
from batchgen.kernels.greedy_cpu import (
    GreedyHead,
    greedy_head_supported,
    greedy_int8_supported,
    greedy_tokens,
    pack_greedy_head,
)

pytestmark = pytest.mark.skipif(
    not (linear_cpu.batchgen_linear_panel() and linear_cpu.batchgen_bf16_linear()),
    reason="needs batchgen's linear kernel and its bfloat16 kernel (a CPU with AVX512-BF16)",
)


_INT8 = pytest.mark.skipif(not greedy_int8_supported(), reason="the int8 estimate needs a CPU with AVX512-VNNI")
# (estimate, candidates' logits from the head's rows): every screen this build can run
SCREENS = [
    pytest.param(("bfloat16", False), id="bf16"),
    pytest.param(("bfloat16", True), id="bf16-rows"),
    pytest.param(("int8", False), id="int8", marks=_INT8),
    pytest.param(("int8", True), id="int8-rows", marks=_INT8),
]


def _head(weight: torch.Tensor, screen: tuple[str, bool] = ("bfloat16", False)) -> GreedyHead:
    kind, keep_rows = screen
    return pack_greedy_head(pack_linear_weight(weight, "batchgen"), weight, kind, keep_rows=keep_rows)


def _reference(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """What the sampler picks without the screen: the argmax of the full float32 logits."""
    return argmax(linear(x, head.exact))


def _estimates(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    return greedy_cpu.estimate_logits(x, head)


@pytest.mark.parametrize("in_features", [1, 16, 64, 576, 2100])
@pytest.mark.parametrize("vocab", [1, 47, 1000])
@pytest.mark.parametrize("screen", SCREENS)
def test_tokens_equal_the_float32_argmax_on_random_rows(in_features: int, vocab: int, screen: tuple[str, bool]) -> None:
    gen = torch.Generator().manual_seed(in_features * 7 + vocab)
    weight = torch.randn(vocab, in_features, generator=gen) * 0.05
    head = _head(weight, screen)
    for scale in (0.01, 1.0, 30.0):
        x = torch.randn(37, in_features, generator=gen) * scale
        assert torch.equal(greedy_tokens(x, head), _reference(x, head))


@pytest.mark.parametrize("screen", SCREENS)
def test_equal_logits_give_the_lowest_index(screen: tuple[str, bool]) -> None:
    # Rows 3, 10 and 700 of the head are one vector: their logits are equal bit for bit, and the
    # largest for x = that vector; the lowest index wins, as torch.argmax picks it.
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(1000, 64, generator=gen) * 0.1
    weight[[10, 700]] = weight[3].clone()
    head = _head(weight, screen)
    x = torch.stack([weight[3] * 5, -weight[3], torch.zeros(64)])
    ref = _reference(x, head)
    assert ref[0] == 3 and ref[2] == 0  # all-zero logits: token 0
    assert torch.equal(greedy_tokens(x, head), ref)


@pytest.mark.parametrize("screen", SCREENS)
def test_logits_closer_than_bfloat16_can_tell_apart(screen: tuple[str, bool]) -> None:
    # Rows that differ in the last bits of one element: their bfloat16 estimates are equal, their
    # float32 logits are not, and only the float32 ones decide which wins.
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(576, generator=gen)
    base[0] = 1.0  # 1 + 0.003 still rounds to 1 in bfloat16 (its spacing there is 2^-7)
    weight = torch.randn(300, 576, generator=gen) * 0.01
    for i, step in enumerate((0.0, 1e-3, -1e-3, 3e-3, 2e-3)):
        weight[50 + 40 * i] = base
        weight[50 + 40 * i, 0] += step
    head = _head(weight, screen)
    x = torch.stack([base, base * 0.5, torch.cat([torch.ones(1), base[1:]])])
    est = _estimates(x, head)
    rows = [50 + 40 * i for i in range(5)]
    assert torch.equal(est[0, rows], est[0, rows[:1]].expand(5))  # the estimate cannot order them
    ref = _reference(x, head)
    assert ref[0] == 170  # the +3e-3 row
    assert torch.equal(greedy_tokens(x, head), ref)


@pytest.mark.parametrize("screen", SCREENS)
def test_rows_whose_estimates_rank_another_token_first(screen: tuple[str, bool]) -> None:
    # 200 head rows a hair apart: for many x the bfloat16 estimates put another token first than
    # the float32 logits do. The screen must still return the float32 argmax on every one.
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(1, 128, generator=gen)
    weight = torch.cat([base + 2e-3 * torch.randn(200, 128, generator=gen), torch.randn(800, 128, generator=gen)])
    head = _head(weight, screen)
    x = base + 0.3 * torch.randn(256, 128, generator=gen)
    ref = _reference(x, head)
    inverted = (argmax(_estimates(x, head)) != ref).nonzero().flatten()
    assert inverted.numel() > 20  # the case is really here
    assert torch.equal(greedy_tokens(x, head), ref)


def test_the_estimate_stays_within_its_bound_where_roundings_add_up() -> None:
    # Every x and w element just under 1 + 2^-8 (the midpoint between bfloat16's 1 and its next
    # value) rounds down to 1: each operand loses almost u = 2^-8 of itself, all products' errors
    # have one sign, and Cauchy-Schwarz is tight for equal vectors; rows scaled by c add the
    # rounding of w. The error comes to nearly the whole bound the screen relies on and must stay
    # within it (a bound with bfloat16's roundoff taken as 2^-9 fails here).
    for in_features in (64, 576, 4096):
        near = 1 + 2.0**-8 * 0.999
        weight = torch.full((48, in_features), near)
        weight[1:] *= torch.linspace(0.5, 1.5, 47)[:, None]
        weight = torch.cat([weight, torch.randn(200, in_features)])
        x = torch.cat([torch.full((1, in_features), near), torch.randn(5, in_features)])
        head = _head(weight)
        err = (_estimates(x, head) - linear(x, head.exact)).abs()
        bound = head.coef * x.double().norm(dim=1, keepdim=True) * weight.double().norm(dim=1)
        ratio = (err.double() / bound).max().item()
        assert 0.9 < ratio <= 1.0, f"K={in_features}: error {ratio:.3f} of the bound"


def test_values_the_bfloat16_instructions_flush_to_zero_stay_candidates() -> None:
    # x[0] is a float32 subnormal: AVX512-BF16 takes it as zero, so token 0's estimate is 0
    # while its float32 logit (1e-39 * 1e11 = 1e-28) is the largest. The relative bound is far
    # too small for that (|x| is 1.2e-38); the absolute part for flushed values must cover it.
    weight = torch.zeros(3, 2)
    weight[0, 0] = 1e11
    weight[1, 1] = 5e9
    weight[2, 1] = 1.0
    head = _head(weight)
    x = torch.tensor([[1e-39, 1.2e-38], [0.0, 1.0]])
    assert _estimates(x, head)[0, 0] == 0  # flushed: the case is really here
    ref = _reference(x, head)
    assert ref.tolist() == [0, 1]
    assert torch.equal(greedy_tokens(x, head), ref)


@pytest.mark.parametrize("screen", SCREENS)
def test_random_rows_with_flushed_values_give_the_float32_argmax(screen: tuple[str, bool]) -> None:
    # The class of the case above: x of float32 subnormals (flushed to zero by AVX512-BF16) with a
    # few normal values just above them, heads whose rows mix large weights on the subnormal
    # coordinates and ordinary ones elsewhere. The estimates drop the subnormal terms; the
    # screen must still return the float32 argmax on every row.
    gen = torch.Generator().manual_seed(9)
    for trial in range(20):
        k, vocab = 8 + trial, 64
        weight = torch.randn(vocab, k, generator=gen) * 10.0 ** torch.randint(0, 12, (vocab, 1), generator=gen)
        x = torch.rand(32, k, generator=gen) * 1e-38  # subnormal in float32 and bfloat16
        x[:, : k // 4] = (torch.rand(32, k // 4, generator=gen) + 1) * 1.2e-38  # normal, barely
        head = _head(weight, screen)
        assert torch.equal(greedy_tokens(x, head), _reference(x, head)), f"trial {trial}"


@pytest.mark.parametrize("screen", SCREENS)
def test_rows_it_cannot_decide_take_the_full_product(monkeypatch: pytest.MonkeyPatch, screen: tuple[str, bool]) -> None:
    # A head of near-equal rows leaves every token a candidate (more than the screen computes);
    # non-finite x gives non-finite estimates. Those rows, and only those, take the full product,
    # and NaN wins the argmax as it does on the full logits.
    gen = torch.Generator().manual_seed(3)
    weight = torch.cat([1 + 1e-4 * torch.randn(2000, 32, generator=gen), torch.randn(100, 32, generator=gen)])
    head = _head(weight, screen)
    x = torch.randn(6, 32, generator=gen)
    x[1] = weight[0]  # near-equal rows all close to the top: thousands of candidates
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    full_rows: list[int] = []
    real_linear = greedy_cpu.linear

    def spy(rows: torch.Tensor, weight_: object) -> torch.Tensor:
        if weight_ is head.exact:  # not the estimate's product
            full_rows.append(rows.shape[0])
        return real_linear(rows, weight_)  # type: ignore[arg-type]

    monkeypatch.setattr(greedy_cpu, "linear", spy)
    tokens = greedy_tokens(x, head)
    assert full_rows == [3]  # rows 1, 3 and 4
    assert torch.equal(tokens, _reference(x, head))


@pytest.mark.parametrize("screen", SCREENS)
def test_decided_rows_never_compute_the_full_product(monkeypatch: pytest.MonkeyPatch, screen: tuple[str, bool]) -> None:
    # The screen is the path: a trained-looking head (rows of varied norms) decides every row
    # from a few float32 logits.
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(5000, 96, generator=gen) * torch.rand(5000, 1, generator=gen)
    head = _head(weight, screen)
    x = torch.randn(64, 96, generator=gen) * 3

    real_linear = greedy_cpu.linear

    def refuse(rows: torch.Tensor, weight_: object) -> torch.Tensor:
        if weight_ is head.exact:
            raise AssertionError("a decided row took the full product")
        return real_linear(rows, weight_)  # type: ignore[arg-type]

    ref = _reference(x, head)
    monkeypatch.setattr(greedy_cpu, "linear", refuse)
    assert torch.equal(greedy_tokens(x, head), ref)


def test_the_kernel_counts_candidates_against_its_limit() -> None:
    # max_candidates 1: a row with two candidates is left undecided (-1), a row with one is not.
    weight = torch.zeros(64, 16)
    weight[5, 0] = 1.0
    weight[9, 0] = 1.0 + 2.0**-20  # the same estimate as row 5, a larger float32 logit
    weight[20, 1] = 1.0
    head = _head(weight)
    x = torch.zeros(2, 16)
    x[0, 0] = 1.0
    x[1, 1] = 1.0
    est = _estimates(x, head)
    kernel = linear_cpu.load_cpu_kernel()
    screened = kernel.greedy_screen(est, x, head.exact.packed, head.norms, head.coef, 1)
    assert screened.tolist() == [-1, 20]
    assert kernel.greedy_screen(est, x, head.exact.packed, head.norms, head.coef, 2).tolist() == [9, 20]


def test_only_a_float32_batchgen_head_is_screened() -> None:
    weight = torch.randn(100, 32)
    assert greedy_head_supported(pack_linear_weight(weight, "batchgen"))
    assert not greedy_head_supported(pack_linear_weight(weight, "batchgen", torch.bfloat16))
    if "onednn" in linear_cpu.packing_libraries():
        assert not greedy_head_supported(pack_linear_weight(weight, "onednn"))
        with pytest.raises(ValueError, match="batchgen's float32 kernel"):
            pack_greedy_head(pack_linear_weight(weight, "onednn"), weight)
    with pytest.raises(ValueError, match=r"\[100, 32\] float32"):
        pack_greedy_head(pack_linear_weight(weight, "batchgen"), weight[:50])


def _int8_bound(x: torch.Tensor, head: GreedyHead) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 estimates of x and their bound sum_g a_g B_vg + |x| Q_v (kernels/cpu_greedy_int8.h),
    in float64, [M, V] each."""
    assert head.int8 is not None
    kernel = linear_cpu.load_cpu_kernel()
    est, a, xn = kernel.greedy_estimate_int8(x.contiguous(), head.int8.weight, head.int8.scales)
    vocab = head.exact.out_features
    b = head.int8.group_norms.permute(0, 2, 1).reshape(-1, head.int8.group_norms.shape[1])[:vocab]
    bound = a.double() @ b.double().T + xn.double()[:, None] * head.int8.q.double()[None, :]
    return est[:, :vocab].double(), bound


@_INT8
def test_the_int8_estimate_stays_within_its_bound_where_quantization_errors_add_up() -> None:
    # Each group of x and of the head's row 0: one element 127 c (it sets the group's scale to c
    # exactly) and the rest (100 + 0.499) c, which quantize to 100 and leave 0.499 c each, all of
    # one sign: both Cauchy-Schwarz steps of the bound are nearly tight, and the error comes to
    # nearly all of it. It must stay within it.
    def pattern(in_features: int, c: float) -> torch.Tensor:
        row = torch.full((in_features,), 100.499 * c)
        row[::64] = 127 * c
        return row

    for in_features in (64, 576, 4096):
        weight = torch.cat([pattern(in_features, 2.0**-4)[None], torch.randn(100, in_features) * 0.1])
        x = torch.stack([pattern(in_features, 2.0**-3), torch.randn(in_features)])
        head = _head(weight, ("int8", False))
        est, bound = _int8_bound(x, head)
        err = (est - linear(x, head.exact).double()).abs()
        ratio = (err / bound).max().item()
        assert 0.9 < ratio <= 1.0, f"K={in_features}: error {ratio:.3f} of the bound"
        assert (err[0, 0] / bound[0, 0]).item() == ratio  # the constructed case is the tight one


@_INT8
@pytest.mark.parametrize("in_features", [5, 64, 200, 576])
def test_the_int8_estimate_stays_within_its_bound_on_hostile_rows(in_features: int) -> None:
    # Magnitudes spread over 30 decades across groups and rows, groups below the smallest scale
    # used (2^-40: left at 0, all error), outlier coordinates, zero rows.
    gen = torch.Generator().manual_seed(in_features)
    weight = torch.randn(300, in_features, generator=gen) * 10.0 ** torch.randint(-15, 8, (300, 1), generator=gen)
    weight[:, : min(3, in_features)] *= 1e3
    weight[7] = 0
    weight[8] = 1e-13  # below 2^-40 in every group
    x = torch.randn(40, in_features, generator=gen) * 10.0 ** torch.randint(-15, 8, (40, 1), generator=gen)
    x[:, -1] *= 1e4
    x[3] = 0
    x[4] = 3e-13
    head = _head(weight, ("int8", False))
    est, bound = _int8_bound(x, head)
    err = (est - linear(x, head.exact).double()).abs()
    assert bool((err <= bound).all()), (err / bound).max()
    assert torch.equal(greedy_tokens(x, head), _reference(x, head))


@_INT8
def test_int8_rows_with_values_past_its_range_take_the_full_product(monkeypatch: pytest.MonkeyPatch) -> None:
    # A value above 1e30 (finite in float32) would overflow the estimate's sums: that row is left
    # undecided and takes the full product; the others are screened.
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(500, 64, generator=gen)
    head = _head(weight, ("int8", True))
    x = torch.randn(4, 64, generator=gen)
    x[2, 7] = 3e31
    full_rows: list[int] = []
    real_linear = greedy_cpu.linear

    def spy(rows: torch.Tensor, weight_: object) -> torch.Tensor:
        if weight_ is head.exact:
            full_rows.append(rows.shape[0])
        return real_linear(rows, weight_)  # type: ignore[arg-type]

    monkeypatch.setattr(greedy_cpu, "linear", spy)
    tokens = greedy_tokens(x, head)
    assert full_rows == [1]
    assert torch.equal(tokens, _reference(x, head))


@_INT8
def test_the_int8_kernel_counts_candidates_against_its_limit() -> None:
    # Rows 5 and 9 of the head differ by 2^-20 in one element: the same int8 estimate, different
    # float32 logits. max_candidates 1 leaves that row undecided (-1), not the row with one.
    weight = torch.zeros(64, 16)
    weight[5, 0] = 1.0
    weight[9, 0] = 1.0 + 2.0**-20
    weight[20, 1] = 1.0
    x = torch.zeros(2, 16)
    x[0, 0] = 1.0
    x[1, 1] = 1.0
    kernel = linear_cpu.load_cpu_kernel()
    for keep_rows in (False, True):
        head = _head(weight, ("int8", keep_rows))
        assert head.int8 is not None
        est, a, xn = kernel.greedy_estimate_int8(x, head.int8.weight, head.int8.scales)
        args = (est, a, xn, x, head.exact.packed, head.int8.group_norms, head.int8.group_norm_norms, head.int8.q)
        assert kernel.greedy_screen_int8(*args, 1, head.rows).tolist() == [-1, 20]
        assert kernel.greedy_screen_int8(*args, 2, head.rows).tolist() == [9, 20]


def test_the_kind_of_estimate_is_the_best_this_build_has() -> None:
    weight = torch.randn(100, 32)
    head = pack_greedy_head(pack_linear_weight(weight, "batchgen"), weight)
    assert (head.int8 is not None) == greedy_int8_supported()
    assert (head.estimate is None) == greedy_int8_supported()
    assert head.rows is None  # kept only when asked: an untied head's weight is not held twice
    with pytest.raises(ValueError, match="'int8' or 'bfloat16'"):
        pack_greedy_head(pack_linear_weight(weight, "batchgen"), weight, "int4")
