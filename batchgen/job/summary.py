"""A job's summary: the figures `summary.json` holds and the table `batchgen run` prints.

Shared by the local and the Ray executors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchgen.job.prepare import MAX_TRACKED_IDS
from batchgen.job.shard_assembly import achieved_hit_rate, ideal_hit_rate
from batchgen.job.stages import PipelineStats
from batchgen.job.structured_rows import STRUCTURED_COUNT_KEYS

__all__ = ["JobSummary", "make_summary"]


@dataclass(frozen=True, slots=True)
class JobSummary:
    data: dict[str, Any]

    def table(self) -> str:
        d = self.data
        lines = [
            f"{'wall time':<28}{d['wall_s']:.1f} s",
            f"{'shards':<28}{d['shards']['committed_this_run']} committed, {d['shards']['skipped']} already done",
            f"{'rows':<28}{d['rows']['total']} ({', '.join(f'{k} {v}' for k, v in sorted(d['rows']['by_status'].items())) or 'none'})",
        ]
        if d["bad_shards"]:
            lines.append(f"{'bad shards (skipped)':<28}{', '.join(sorted(d['bad_shards']))}")
        if d["rows"]["duplicate_ids_across_shards"]:
            lines.append(f"{'ids repeated across shards':<28}{d['rows']['duplicate_ids_across_shards']}")
        if d["rows"]["error_codes"]:
            codes = ", ".join(f"{k} {v}" for k, v in sorted(d["rows"]["error_codes"].items()))
            lines.append(f"{'errors by code':<28}{codes}")
        t = d["tokens"]
        lines += [
            f"{'prompt tokens':<28}{t['prompt']}",
            f"{'cached prompt tokens':<28}{t['cached']}",
            f"{'prefill tokens computed':<28}{t['prefill_computed']}",
            f"{'output tokens':<28}{t['output']}",
            f"{'output tokens/s':<28}{d['tokens_per_s']['output']:.1f}",
            f"{'total tokens/s':<28}{d['tokens_per_s']['total']:.1f}",
            f"{'preemptions':<28}{d['preemptions']}",
            f"{'prefix hit rate':<28}{d['prefix_hit_rate']['achieved']:.1%} (ideal {d['prefix_hit_rate']['ideal']:.1%})",
        ]
        structured = d.get("structured_outputs", {})
        if structured.get("constrained"):
            lines.append(
                f"{'structured output rows':<28}{structured['constrained']} ({structured['completed']} completed "
                f"their grammar, {structured['cut_by_length']} cut by length)"
            )
        return "\n".join(lines)


def make_summary(
    stats: PipelineStats,
    wall_s: float,
    *,
    skipped: int,
    bad_shards: Mapping[str, str],
    duplicate_ids: int,
    ids_tracked: int,
    duplicates_checked: bool = True,
) -> JobSummary:
    """The run's figures. `bad_shards` (name -> error) are the shards skipped as unreadable,
    this run or before; `duplicate_ids` counts rows whose id another shard of this run already
    had, checked over the first `ids_tracked` distinct ids (complete below MAX_TRACKED_IDS);
    `duplicates_checked` is False where no one process saw every shard (the Ray executor)."""
    engine = stats.engine
    prompt = engine.get("prompt_tokens", 0)
    output = engine.get("generation_tokens", 0)
    return JobSummary(
        {
            "wall_s": round(wall_s, 3),
            "pipeline_s": round(stats.wall_s, 3),
            "shards": {"committed_this_run": len(stats.committed_shards), "skipped": skipped},
            "bad_shards": dict(sorted(bad_shards.items())),
            "rows": {
                "total": stats.num_rows,
                "output_rows": stats.num_output_rows,
                "by_status": dict(stats.rows_by_status),
                "error_codes": dict(stats.error_codes),
                "duplicate_ids_across_shards": duplicate_ids,
                "duplicate_id_check": {
                    "ids_tracked": ids_tracked,
                    "complete": duplicates_checked and ids_tracked < MAX_TRACKED_IDS,
                },
            },
            "tokens": {
                "prompt": stats.prompt_tokens,
                "cached": stats.cached_tokens,
                "prefill_computed": engine.get("prefill_tokens_computed", 0),
                "output": stats.output_tokens,
            },
            "tokens_per_s": {
                "output": output / stats.wall_s if stats.wall_s else 0.0,
                "total": (output + prompt) / stats.wall_s if stats.wall_s else 0.0,
            },
            "preemptions": engine.get("num_preemptions", 0),
            "prefix_hit_rate": {"achieved": achieved_hit_rate(stats), "ideal": ideal_hit_rate(stats)},
            "kv_blocks": {
                "total": engine.get("num_kv_blocks", 0),
                "peak_used": engine.get("peak_kv_blocks_used", 0),
            },
            "structured_outputs": {k: stats.structured_outputs.get(k, 0) for k in STRUCTURED_COUNT_KEYS},
        }
    )
