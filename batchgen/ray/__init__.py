"""batchgen on Ray: `executor: ray` for jobs, and a Ray Data stage for Ray Datasets.

Owns: the job driver that hands input shards to a pool of Ray actors (`driver`: `run_ray_job`),
the pool itself (`pool`: starts against a deadline, stall detection, kills and replacements,
cluster loss), the actor that runs the local pipeline over one shard at a time (`worker`:
`ShardWorker`), reaching the cluster (`cluster`) and the Ray Data stage (`data`: `Generate`, for
``ds.map_batches``).

Ray is an optional extra (``pip install 'batchgen[ray]'``): only the driver imports it, when a
job runs; without it `executor: ray` stops with a message saying how to install it.

May import: batchgen.job, batchgen.engine, batchgen.models, batchgen.tokenizer, batchgen.io,
batchgen.data and ray. Imported by batchgen.cli only.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = ["Generate", "ShardWorker", "run_ray_job"]

__getattr__ = lazy_getattr(
    __name__,
    {"Generate": "data", "ShardWorker": "worker", "run_ray_job": "driver"},
)
