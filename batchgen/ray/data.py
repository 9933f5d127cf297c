"""`batchgen.ray.Generate`: a Ray Data stage (a callable class for ``Dataset.map_batches``).

Owns: nothing but a `TableGenerator` per actor: the model and engine are loaded once, in the
constructor, and every batch goes through the same pipeline as `batchgen.generate` (prepare,
prefix order, engine), coming back with the output columns of a job (same schema, per-row
errors). Does not import ray: Ray Data instantiates the class on its actors.

May import: batchgen.job.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batchgen.job.generate import TableGenerator

__all__ = ["Generate"]


class Generate:
    """For ``ds.map_batches(Generate, fn_constructor_kwargs={...}, batch_format="pyarrow",
    compute=ray.data.ActorPoolStrategy(size=N))``.

    `fn_constructor_kwargs` are `batchgen.generate`'s keyword arguments (model, sampling,
    prompt_column or messages_column, id_column, seed, engine options, ...); `use_tqdm`
    defaults to False. Pass `id_column` for seeded sampling: each row's seed then derives
    from its id as in a job, not from its position inside a batch. Raises what
    `batchgen.generate` raises (ValueError for bad values, TypeError for unknown arguments).
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("use_tqdm", False)
        self._generate = TableGenerator(**kwargs)

    def __call__(self, batch: pa.Table | dict[str, Any]) -> pa.Table:
        """The batch (a pyarrow.Table, or a dict of columns) with the output columns appended,
        `n` rows per input row when sampling `n` > 1."""
        table = batch if isinstance(batch, pa.Table) else pa.table(batch)
        result: pa.Table = self._generate(table)
        return result
