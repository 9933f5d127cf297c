"""Finding a job's input files: folders (recursively: Hive ``key=value/`` partitions and
nested folders), globs and single files.

Owns: the list of input shards (`find_input_shards`, `list_input_shards`), the name of each
one's output shard (`shard_name`), its Hive partition values (`hive_partitions`), and the
check that a job's output cannot overwrite, delete or re-read its inputs
(`check_output_outside_inputs`).

Invariants:
- Shards are returned sorted by path and have distinct output shard names (an output shard is
  named after its input shard, so two inputs with one name would overwrite each other's output).
- Nothing in a folder is skipped silently except metadata: names starting with ``.`` or ``_``
  (``_SUCCESS``, ``_temporary/``, our temporary files) and an `exclude` folder (a run-batch
  output folder inside a folder of request files). A Parquet job's output folder inside the
  input set is refused outright (`check_output_outside_inputs`).

May import: the standard library. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

__all__ = [
    "InputShard",
    "check_output_outside_inputs",
    "find_input_shards",
    "hive_partitions",
    "list_input_shards",
    "resolve_path",
    "shard_name",
]

_GLOB_CHARS = frozenset("*?[")
_KINDS = {".parquet": "Parquet", ".jsonl": "JSONL"}


def resolve_path(spec: str, base_dir: Path) -> Path:
    """`spec` (``~`` expanded) made absolute against `base_dir` and normalised; no I/O."""
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.normpath(path))


def _is_hidden(name: str) -> bool:
    # Hive, Spark and pyarrow.dataset keep metadata under these prefixes (_SUCCESS,
    # _temporary/, .crc files), and our own temporary files start with a dot.
    return name.startswith((".", "_"))


def _walk_files(folder: Path, exclude: Path | None, suffix: str) -> list[Path]:
    """Every visible file named ``*{suffix}`` under `folder`, at any depth, skipping `exclude`."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if not _is_hidden(d) and (exclude is None or here / d != exclude)
        )
        found.extend(
            here / f
            for f in filenames
            if f.endswith(suffix) and not _is_hidden(f) and (here / f).is_file()
        )
    return found


def shard_name(path: Path, root: Path) -> str:
    """The name of the output shard of input `path` found under folder `root`: the path
    relative to `root` with folder separators written as ``__`` (``date=1/part-0.parquet`` ->
    ``date=1__part-0.parquet``); a file directly in `root` keeps its name."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return path.name
    return "__".join(parts)


def hive_partitions(path: Path, root: Path) -> tuple[tuple[str, str], ...]:
    """The ``key=value`` folder names between `root` and `path`, outermost first."""
    try:
        folders = path.relative_to(root).parts[:-1]
    except ValueError:
        return ()
    pairs = []
    for folder in folders:
        key, sep, value = folder.partition("=")
        if sep and key:
            pairs.append((key, value))
    return tuple(pairs)


def _glob_root(resolved: Path) -> Path:
    """The leading folders of a glob pattern, up to the first component with a glob char."""
    parts: list[str] = []
    for part in resolved.parts[:-1]:
        if not _GLOB_CHARS.isdisjoint(part):
            break
        parts.append(part)
    return Path(*parts) if parts else Path("/")


@dataclass(frozen=True, slots=True)
class InputShard:
    """One input file: its path, the name of its output shard and its Hive partition values."""

    path: Path
    name: str
    partitions: tuple[tuple[str, str], ...] = ()


def find_input_shards(
    spec: str, base_dir: Path, *, exclude: Path | None = None, suffix: str = ".parquet"
) -> list[InputShard]:
    """The input shards named by `spec`: a folder (its ``*.parquet`` files at any depth, as
    Hive-partitioned (``key=value/``) and other nested datasets are laid out; folders and files
    starting with ``.`` or ``_`` are metadata and skipped) or a glob (``**`` recurses); relative
    specs resolve against `base_dir`. `exclude` (the job's output folder, when it sits inside
    the input folder) is not read. `suffix` names the files a folder is searched for.

    Output shard names: a file found in a folder is named by its path below the folder
    (`shard_name`); a glob match or a single file keeps its file name. Partition values come
    from ``key=value`` folders below the folder (or below a glob's leading folders).
    Returns the shards sorted by path. Raises InputError when nothing matches, the folder does
    not exist, or two shards would get the same output shard name.
    """
    resolved = resolve_path(spec, base_dir)
    is_folder = False
    if _GLOB_CHARS.isdisjoint(spec):
        if not resolved.exists():
            raise InputError(f"input '{spec}' does not exist (resolved to {resolved})")
        if resolved.is_dir():
            is_folder = True
            root = resolved
            paths = _walk_files(resolved, exclude, suffix)
            if not paths:
                raise InputError(
                    f"no {_KINDS.get(suffix, suffix)} files in input folder '{spec}' (resolved to "
                    f"{resolved}) or its subfolders; expected files named *{suffix}"
                )
        else:
            root = resolved.parent
            paths = [resolved]
    else:
        pattern = Path(spec).expanduser()
        if not pattern.is_absolute():  # base_dir is a literal path even if it holds '[' or '*'
            pattern = Path(glob.escape(str(base_dir))) / pattern
        found = glob.glob(os.path.normpath(pattern), recursive=True)
        paths = [Path(p) for p in found if os.path.isfile(p)]
        if not paths:
            raise InputError(
                f"no {_KINDS.get(suffix, suffix)} files match '{spec}' (resolved to {resolved})"
            )
        root = _glob_root(resolved)
    paths.sort()
    shards: list[InputShard] = []
    by_name: dict[str, Path] = {}
    for path in paths:
        name = shard_name(path, root) if is_folder else path.name
        other = by_name.setdefault(name, path)
        if other != path:
            raise InputError(
                f"input shards {other} and {path} share the file name '{path.name}'; "
                "their output shards would collide: rename one, narrow the input glob or "
                "give the folder above them as the input"
            )
        shards.append(InputShard(path, name, hive_partitions(path, root)))
    return shards


def list_input_shards(spec: str, base_dir: Path, *, exclude: Path | None = None) -> list[Path]:
    """The paths of `find_input_shards`, sorted."""
    return [shard.path for shard in find_input_shards(spec, base_dir, exclude=exclude)]


def _input_root(spec: str, base_dir: Path) -> Path:
    """What an input spec reads from: the folder or file itself, or the part of a glob before
    its first wildcard component."""
    resolved = resolve_path(spec, base_dir)
    if _GLOB_CHARS.isdisjoint(spec):
        return resolved
    static: list[str] = []
    for part in Path(spec).expanduser().parts:
        if not _GLOB_CHARS.isdisjoint(part):
            break
        static.append(part)
    return resolve_path(os.path.join(*static), base_dir) if static else base_dir


def _glob_reads_folder(spec: str, base_dir: Path, folder: Path) -> bool:
    """Whether the glob `spec` would match Parquet files placed directly in `folder`: below its
    fixed prefix for a recursive (``**``) glob, else when `folder` matches the glob's folder
    part component by component."""
    pattern = resolve_path(spec, base_dir)
    if "**" in spec:
        root = _input_root(spec, base_dir)
        return folder == root or root in folder.parents
    folder_parts = pattern.parent.parts
    return len(folder.parts) == len(folder_parts) and all(
        fnmatch.fnmatchcase(name, part) for name, part in zip(folder.parts, folder_parts, strict=True)
    )


def check_output_outside_inputs(
    out_dir: Path, spec: str, base_dir: Path, input_paths: list[Path]
) -> None:
    """Refuse an output folder that equals, contains or lies inside the input set: an input
    folder (or file), a folder a glob would read from, or a folder holding an input shard.
    Output shards are named after input shards and ``--restart`` deletes them, so such a folder
    could overwrite or delete the inputs, or feed outputs back as inputs. Symbolic links are
    resolved; no file is touched. Raises InputError naming both paths."""
    out_real = Path(os.path.realpath(out_dir))
    is_glob = not _GLOB_CHARS.isdisjoint(spec)
    root = Path(os.path.realpath(_input_root(spec, base_dir)))
    candidates = [(Path(os.path.realpath(p)), f"the input shard {p}") for p in input_paths]
    if not is_glob:
        candidates.insert(0, (root, f"the input {root}"))
    for path, what in candidates:
        if out_real == path or out_real in path.parents:
            relation = "is" if out_real == path else "contains"
        elif not is_glob and root in out_real.parents:
            relation = "lies inside"
        else:
            continue
        _refuse(out_dir, spec, relation, what)
    if is_glob and (
        _glob_reads_folder(spec, base_dir, Path(os.path.normpath(out_dir)))
        or _glob_reads_folder(spec, base_dir, out_real)
    ):
        _refuse(out_dir, spec, "lies inside", "the folders the input glob reads")


def _refuse(out_dir: Path, spec: str, relation: str, what: str) -> None:
    raise InputError(
        f"output.path {out_dir} {relation} {what} (input.path '{spec}'); output shards "
        "are named after input shards and --restart deletes them, so the output folder "
        "must lie outside the input set: choose another output.path"
    )
