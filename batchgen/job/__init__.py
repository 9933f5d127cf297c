"""The job layer: `batchgen run job.yaml` and `batchgen.generate(table)`.

Owns the job file (`config`: the dataclasses; `config_file`: YAML loading and validation), row
preparation (`prepare`), the anyio pipeline and its stage types (`pipeline`, `stages`), shard
reassembly (`shard_assembly`), the file source/sink and summary (`run`), resume and restart
against the manifest (`resume`), the setup checks that need the machine or the model
(`setup`), and `generate` over Arrow/Polars tables.

May import: batchgen.engine, batchgen.models, batchgen.tokenizer, batchgen.io, batchgen.radix,
batchgen.data. Never batchgen.cli.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = ["JobConfig", "JobConfigError", "generate", "load_job_config", "run_job"]

__getattr__ = lazy_getattr(
    __name__,
    {
        "JobConfig": "config",
        "JobConfigError": "config",
        "load_job_config": "config_file",
        "generate": "generate",
        "run_job": "run",
    },
)
