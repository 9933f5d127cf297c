"""Write a job of N rows (default a million) for timing `batchgen simulate` at scale (issue 24).

The packaged ShareGPT conversations' first user turns (about 11k), repeated with a copy number
in front of each prompt so that no two rows are equal (a repeat shares the chat template's
prefix with the others, not its whole prompt), in Parquet shards of 50,000 rows, and a job file
beside them. Then, for example:

    python jobs/sim/million_rows.py /tmp/million
    time batchgen simulate /tmp/million/job.yaml --hardware h100-sxm \
        --model-config jobs/sim/llama-3-8b.json --out /tmp/million/sim
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.data.sharegpt import iter_sharegpt_conversations

JOB = """\
# {rows:,} rows of ShareGPT first turns (copies numbered), for timing `batchgen simulate`.
model: null
input:
  path: data
  columns: {{id: id, messages: messages}}
output:
  path: out
sampling: {{max_tokens: 256, temperature: 0.0}}
engine: {{max_num_seqs: 256, max_num_batched_tokens: 8192}}
prompt_too_long: truncate_left
order: prefix
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shard-rows", type=int, default=50_000)
    args = parser.parse_args()
    firsts = [(conv_id, messages[0]["content"]) for conv_id, messages in iter_sharegpt_conversations() if messages]
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    ids: list[str] = []
    messages: list[list[dict[str, str]]] = []
    shard = 0

    def flush() -> None:
        nonlocal shard, ids, messages
        if ids:
            table = pa.table({"id": ids, "messages": messages})
            pq.write_table(table, data / f"part-{shard:04d}.parquet")
            shard += 1
            ids, messages = [], []

    for row in range(args.rows):
        copy, (conv_id, text) = divmod(row, len(firsts))[0], firsts[row % len(firsts)]
        ids.append(f"{conv_id}#{copy}")
        messages.append([{"role": "user", "content": f"({copy}) {text}"}])
        if len(ids) == args.shard_rows:
            flush()
    flush()
    (args.out / "job.yaml").write_text(JOB.format(rows=args.rows), encoding="utf-8")
    print(f"{args.rows:,} rows in {shard} shards under {data}; job: {args.out / 'job.yaml'}")


if __name__ == "__main__":
    main()
