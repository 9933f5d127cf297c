"""Throughput of every supported family at about 100M parameters, beside a Llama (issue 23).

usage: python jobs/bench/families.py [--families qwen3,gemma2] [--num-prompts 64] [--max-tokens 64]
           [--rounds 2] [--work /tmp/batchgen-families] [--threads N] [--tiny]

For each family it writes a Hugging Face folder (`<work>/<family>-100m`): config.json built by
the family's own transformers config class (its real `architectures`, `model_type` and fields),
random float32 weights from `AutoModelForCausalLM.from_config` as safetensors, and the built-in
model's tokenizer (SmolLM2, 49,152 tokens). A folder built earlier with the same config is
reused. Then it runs `batchgen bench --workload single-turn --ignore-eos` on each folder in a
subprocess, every family once per round (odd rounds in reverse order, so a drifting machine
does not favour one end), all on one request file (`<work>/requests-n<N>-m<M>.jsonl`, written
by the first run), and prints out tok/s per round, the median and its ratio to Llama's median.

The sizes are chosen so that the families differ only in what makes them a family: every model
has hidden size 768, 12 layers, query width 768, K/V width 256 (512 floats of KV per token and
layer), a dense MLP of 1536 (MoE: 8 experts of 192, top 2, the same total MLP parameters) and
tied embeddings, hence about 99M parameters each (MoE: about 67M active). The head_dim is the
family's (64 Llama and Phi-3, 128 Qwen3, Mixtral and SmolLM3, 256 Gemma), as are norms, soft
caps, q/k norms, partial rotary, NoPE layers and rope bases. Departures from the real configs,
for the comparison: tied embeddings everywhere (Mixtral and Qwen3-MoE untie theirs, which adds
parameters but no compute per token) and Gemma's sliding window of 256 tokens instead of 4096
(Gemma 2) or 512 (Gemma 3), so that it slides within this workload's sequences (prompts of at
most 512 tokens plus the outputs).

"fast path" is "no" when the engine logged its load-time notice ("<model_type> model: ...",
logger batchgen.models, see batchgen/models/decoder.py) that part of the model runs on the
PyTorch path or unpacked; the notices are printed under the table.

`--tiny` checks the script end to end in seconds: about 2M parameters (hidden 32, 4 layers),
4 prompts, 4 tokens, one round, folders `<work>/<family>-tiny`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

BASELINE = "llama"


class Family(NamedTuple):
    config_class: str  # transformers config class
    model_type: str  # batchgen's architecture name, the prefix of its load notices
    fields: dict[str, Any]  # config fields at about 100M parameters
    tiny_fields: dict[str, Any]  # overrides for --tiny


_WINDOW = 256

FAMILIES: dict[str, Family] = {
    # SmolLM2's kind of Llama: head_dim 64, GQA 3, rope base 1e5.
    "llama": Family("LlamaConfig", "llama", {
        "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
    }, {}),
    # Qwen3 (0.6B-8B): head_dim 128, q/k norms, no window (max_window_layers = all layers).
    "qwen3": Family("Qwen3Config", "qwen3", {
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 128, "use_sliding_window": False,
        "max_window_layers": 12, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }, {"max_window_layers": 4}),
    # Qwen3-30B-A3B's MoE: every layer sparse, softmax top-k renormalized.
    "qwen3_moe": Family("Qwen3MoeConfig", "qwen3_moe", {
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 128, "use_sliding_window": False,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 192, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }, {"moe_intermediate_size": 16}),
    # Mixtral 8x7B: 8 experts top 2 (intermediate_size is each expert's), head_dim 128, no window.
    "mixtral": Family("MixtralConfig", "mixtral", {
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 192,
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }, {"intermediate_size": 16}),
    # Gemma 2: head_dim 256, window on every other layer, soft caps 50 / 30, GELU, four norms.
    "gemma2": Family("Gemma2Config", "gemma2", {
        "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
        "sliding_window": _WINDOW, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }, {}),
    # Gemma 3 (text, 1B): q/k norms, five window layers to one global, local base 1e4, global 1e6.
    "gemma3": Family("Gemma3TextConfig", "gemma3_text", {
        "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
        "sliding_window": _WINDOW, "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }, {}),
    # Phi-4-mini's attention: partial rotary 0.75, GQA 3 (head_dim = hidden / heads = 64).
    "phi3": Family("Phi3Config", "phi3", {
        "num_attention_heads": 12, "num_key_value_heads": 4, "partial_rotary_factor": 0.75,
        "sliding_window": None, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }, {}),
    # SmolLM3: every fourth layer without rotary embedding, head_dim 128, rope base 5e6.
    "smollm3": Family("SmolLM3Config", "smollm3", {
        "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 128, "no_rope_layer_interval": 4,
        "use_sliding_window": False, "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
    }, {}),
}  # fmt: skip

_COMMON = {
    "hidden_size": 768, "intermediate_size": 1536, "num_hidden_layers": 12, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "pad_token_id": None,
}  # fmt: skip
# The family's head_dim stays (Phi-3's becomes 16); two query heads divide the hidden size.
_TINY = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 1,
}  # fmt: skip


def config_fields(name: str, *, tiny: bool) -> dict[str, Any]:
    """The keyword arguments of `name`'s transformers config class (without token ids)."""
    family = FAMILIES[name]
    fields = {**_COMMON, **family.fields}
    if tiny:
        fields.update(_TINY)
        fields.update(family.tiny_fields)
    if name == "gemma3":  # Gemma 3's pattern: every sixth layer global (the last one in --tiny)
        period = min(6, fields["num_hidden_layers"])
        fields["layer_types"] = [
            "full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(fields["num_hidden_layers"])
        ]
    return fields


def _build_folder(name: str, folder: Path, fields: dict[str, Any]) -> None:
    """Write config.json, model.safetensors (random, float32) and the tokenizer into `folder`,
    through a temporary sibling so that a half-written folder is never reused."""
    import gguf
    import torch
    import transformers

    from batchgen.models.checkpoint import default_model_path
    from batchgen.tokenizer.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))
    config = getattr(transformers, FAMILIES[name].config_class)(
        vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **fields,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "families-spec.json").write_text(json.dumps(fields, sort_keys=True) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def ensure_folder(name: str, work: Path, *, tiny: bool) -> Path:
    """`<work>/<name>-100m` (or `-tiny`), built unless it holds this script's current config."""
    fields = config_fields(name, tiny=tiny)
    folder = work / f"{name}-{'tiny' if tiny else '100m'}"
    spec = folder / "families-spec.json"
    is_current = spec.is_file() and json.loads(spec.read_text()) == json.loads(json.dumps(fields, sort_keys=True))
    if is_current and any(folder.glob("*.safetensors")):
        print(f"reusing {folder}", file=sys.stderr)
        return folder
    print(f"building {folder}", file=sys.stderr)
    _build_folder(name, folder, fields)
    return folder


class ParamCounts(NamedTuple):
    total: int
    active: int  # per token: all but the unrouted experts' share


def count_params(folder: Path) -> ParamCounts:
    """Parameters in the folder's safetensors files (read from their headers; tied embeddings
    once), and the active ones: expert tensors count num_experts_per_tok / num_experts."""
    config = json.loads((folder / "config.json").read_text())
    num_experts = config.get("num_experts") or config.get("num_local_experts")
    share = config["num_experts_per_tok"] / num_experts if num_experts else 1.0
    total = 0
    experts = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for key, info in header.items():
            if key == "__metadata__":
                continue
            size = 1
            for dim in info["shape"]:
                size *= dim
            total += size
            if ".experts." in key:
                experts += size
    return ParamCounts(total, total - round(experts * (1 - share)))


class RunResult(NamedTuple):
    out_tokens_per_s: float
    notices: tuple[str, ...]  # the engine's load-time fast-path notices


def _batchgen_command() -> list[str]:
    script = Path(sys.executable).with_name("batchgen")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "batchgen.cli.main"]


def run_bench(folder: Path, model_type: str, requests: Path, out: Path, args: argparse.Namespace) -> RunResult:
    """One `batchgen bench` subprocess on `folder`; writes `requests` if it does not exist yet.
    Raises RuntimeError (with the subprocess's stderr) when the run fails."""
    command = [
        *_batchgen_command(), "bench", "--model", str(folder), "--workload", "single-turn",
        "--num-prompts", str(args.num_prompts), "--max-tokens", str(args.max_tokens), "--ignore-eos",
        "--quiet", "--out", str(out),
    ]  # fmt: skip
    command += ["--requests-in", str(requests)] if requests.is_file() else ["--requests-out", str(requests)]
    for option in ("threads", "device", "dtype"):
        if getattr(args, option) is not None:
            command += [f"--{option}", str(getattr(args, option))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}\nexit {proc.returncode}\n{proc.stderr[-4000:]}")
    # decoder.py logs `"%s model: %s" % (config.architecture, note)` once at load when a part of
    # the model cannot take the fast path; no handler is configured, so it lands on stderr.
    notice = re.compile(rf"^{re.escape(model_type)} model: (.+)$")
    notices = tuple(m.group(1) for line in proc.stderr.splitlines() if (m := notice.match(line.strip())))
    results = json.loads(out.read_text())["results"]
    return RunResult(float(results[0]["output_tokens_per_s"]), notices)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def print_table(
    names: list[str],
    params: dict[str, ParamCounts],
    rates: dict[str, list[float]],
    notices: dict[str, set[str]],
    failures: dict[str, str],
) -> None:
    num_rounds = max((len(r) for r in rates.values()), default=0)
    header = ["family", "total", "active", *[f"r{i + 1} tok/s" for i in range(num_rounds)], "median", "vs llama", "fast path"]
    base = statistics.median(rates[BASELINE]) if rates.get(BASELINE) else None
    rows = []
    for name in names:
        runs = rates.get(name, [])
        median = statistics.median(runs) if runs else None
        ratio = f"{median / base:.2f}" if median is not None and base else "-"
        fast = "failed" if name in failures else ("no" if notices.get(name) else "yes")
        rows.append([
            name, _fmt_params(params[name].total), _fmt_params(params[name].active),
            *[f"{r:.1f}" for r in runs], *["-"] * (num_rounds - len(runs)),
            "-" if median is None else f"{median:.1f}", ratio, fast,
        ])  # fmt: skip
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for name in names:
        for note in sorted(notices.get(name, ())):
            print(f"{name}: {note}")
        if name in failures:
            print(f"{name} failed: {failures[name]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--num-prompts", type=int, default=None, help="default 64 (--tiny: 4)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 64 (--tiny: 4)")
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (--tiny: 1)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/batchgen-families"), help="model folders, requests, results")
    parser.add_argument("--threads", type=int, default=None, help="passed to batchgen bench")
    parser.add_argument("--device", default=None, help="passed to batchgen bench")
    parser.add_argument("--dtype", default=None, help="passed to batchgen bench")
    parser.add_argument("--build-only", action="store_true", help="build the folders, print their parameter counts")
    parser.add_argument("--tiny", action="store_true", help="about 2M parameters, 4 prompts, 4 tokens, 1 round")
    args = parser.parse_args()
    args.num_prompts = args.num_prompts or (4 if args.tiny else 64)
    args.max_tokens = args.max_tokens or (4 if args.tiny else 64)
    args.rounds = args.rounds or (1 if args.tiny else 2)
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    if BASELINE not in names:  # every ratio is to a Llama measured in the same rounds
        names.insert(0, BASELINE)
    args.work.mkdir(parents=True, exist_ok=True)
    folders = {name: ensure_folder(name, args.work, tiny=args.tiny) for name in names}
    params = {name: count_params(folder) for name, folder in folders.items()}
    if args.build_only:
        for name in names:
            print(f"{name}: {params[name].total:,} total, {params[name].active:,} active  ({folders[name]})")
        return 0
    requests = args.work / f"requests-n{args.num_prompts}-m{args.max_tokens}.jsonl"
    results_dir = args.work / "results"
    rates: dict[str, list[float]] = {}
    notices: dict[str, set[str]] = {}
    failures: dict[str, str] = {}
    for round_idx in range(args.rounds):
        order = names if round_idx % 2 == 0 else names[::-1]
        for name in order:
            if name in failures:
                continue
            out = results_dir / f"{folders[name].name}-r{round_idx + 1}.json"
            try:
                result = run_bench(folders[name], FAMILIES[name].model_type, requests, out, args)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                failures[name] = str(exc).splitlines()[-1]
                continue
            rates.setdefault(name, []).append(result.out_tokens_per_s)
            notices.setdefault(name, set()).update(result.notices)
            print(f"round {round_idx + 1}/{args.rounds} {name}: {result.out_tokens_per_s:.1f} out tok/s", file=sys.stderr)
    print_table(names, params, rates, notices, failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
