"""Structured output in a job: error codes, the job-level check, and the counts of constrained rows.

- A row whose structured_outputs the grammar engine rejects (a bad schema, regex or grammar),
  or that is malformed (two kinds, a schema that is not JSON), is an error row with the code
  ``bad_structured_output`` and the reason as its message; the job goes on.
- The job file's ``sampling.structured_outputs`` applies to every row: it is compiled before
  anything runs, and a rejection is an `InputError` (exit 2) naming that key.
- Counts (`StructuredCounts`, summed over output rows): constrained (rows generated under a
  constraint), completed (their text is a complete match), cut_by_length (max_tokens came
  first); the rest were cut by a stop string.

Imports no torch at module level (the prepare stage uses it). May import: batchgen.engine,
batchgen.models, batchgen.io, batchgen.job.row_error.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from batchgen.engine.outputs import RequestOutput
from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.structured.grammar import StructuredOutputError
from batchgen.io import InputError
from batchgen.job.row_error import RowError

if TYPE_CHECKING:
    from batchgen.models.checkpoint import Checkpoint

__all__ = [
    "BAD_STRUCTURED_OUTPUT",
    "STRUCTURED_COUNT_KEYS",
    "check_job_structured_outputs",
    "count_structured",
    "request_error",
    "sampling_params_error",
]

BAD_STRUCTURED_OUTPUT = "bad_structured_output"
STRUCTURED_COUNT_KEYS = ("constrained", "completed", "cut_by_length")
_FIELD_PREFIX = "SamplingParams.structured_outputs"


def sampling_params_error(message: str) -> RowError:
    """The error row of a per-row sampling_params that did not validate: a structured_outputs
    problem is ``bad_structured_output``, anything else ``invalid_sampling_params``."""
    if message.startswith(_FIELD_PREFIX):
        return RowError(BAD_STRUCTURED_OUTPUT, message)
    return RowError("invalid_sampling_params", message)


def request_error(exc: ValueError) -> RowError:
    """The error row of a request the engine refused at submission."""
    if isinstance(exc, StructuredOutputError):
        return RowError(BAD_STRUCTURED_OUTPUT, str(exc))
    return RowError("invalid_request", str(exc))


def count_structured(counts: Counter[str], out: RequestOutput) -> None:
    """Add a finished request's samples to `counts` (nothing for an unconstrained one)."""
    for sample in out.outputs:
        if sample.grammar_completed is None:
            continue
        counts["constrained"] += 1
        if sample.grammar_completed:
            counts["completed"] += 1
        elif sample.finish_reason == "length":
            counts["cut_by_length"] += 1


def check_job_structured_outputs(sampling: SamplingParams, checkpoint: Checkpoint, *, source: str) -> None:
    """Compile the job-level constraint once, for the model's tokenizer; InputError naming
    ``sampling.structured_outputs`` in `source` (the job file) when the grammar engine rejects
    it. Costs the tokenizer adapter's build (about a second) when the key is set, else nothing."""
    structured = sampling.structured
    if structured is None:
        return
    from batchgen.engine.structured.runtime import StructuredOutputs  # torch: not for prepare

    tokenizer = checkpoint.tokenizer
    eos = set(checkpoint.config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    checker = StructuredOutputs(tokenizer, vocab_size=checkpoint.config.vocab_size, eos_token_ids=eos)
    try:
        checker.compile(structured)
    except StructuredOutputError as exc:
        raise InputError(f"{source}: sampling.structured_outputs: {exc}") from exc
