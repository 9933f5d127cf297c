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
- One rule for symbolic links, in folders and globs alike: links to files and folders are
  followed (a Hive partition ``date=2 -> ../real/date=2`` is read like a folder); a link cycle,
  a folder or file reached twice (two links to one target, or hard links: every row would be
  read twice) and a broken link are refused with an InputError naming them, never skipped.
- "The same file" means the same device and inode (`file_key`), not the same spelling: a bind
  mount or a case-insensitive file system cannot make an output equal an input unnoticed.

May import: the standard library. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

__all__ = [
    "FileKey",
    "InputShard",
    "check_output_outside_inputs",
    "file_key",
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


FileKey = tuple[int, int]


def file_key(path: Path) -> FileKey | None:
    """(device, inode) of what `path` names, links followed; None when it does not exist.
    Two paths name the same file exactly when their keys are equal."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _broken_link(path: Path) -> InputError:
    return InputError(
        f"input {path} is a broken symbolic link (to {os.readlink(path)}); fix or remove it"
    )


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"cannot list input folder {folder}: {exc.strerror or exc}") from exc


def _enter(folder: Path, ancestors: dict[FileKey, Path]) -> dict[FileKey, Path]:
    """`ancestors` with `folder` added; refuses a folder that is its own ancestor (a cycle)."""
    key = file_key(folder)
    if key is None:
        raise _broken_link(folder)
    if key in ancestors:
        raise InputError(
            f"input folder {folder} is a symbolic link cycle (it is {ancestors[key]} again); "
            "remove the link or give a folder below it as the input"
        )
    return {**ancestors, key: folder}


def _walk_files(folder: Path, exclude: Path | None, suffix: str) -> list[Path]:
    """Every visible file named ``*{suffix}`` under `folder`, at any depth, links followed,
    skipping `exclude`. Raises InputError for a link cycle, a folder reached twice or a broken
    link."""
    found: list[Path] = []
    visited: dict[FileKey, Path] = {}
    exclude_key = file_key(exclude) if exclude is not None else None

    def visit(here: Path, ancestors: dict[FileKey, Path]) -> None:
        ancestors = _enter(here, ancestors)
        key = next(reversed(ancestors))
        if key in visited:
            raise InputError(
                f"input folder {visited[key]} is reached twice (also as {here}, through a "
                "symbolic link): its rows would be read twice; remove one of the links"
            )
        visited[key] = here
        for entry in _entries(here):
            if _is_hidden(entry.name):
                continue
            path = here / entry.name
            if entry.is_dir():
                if exclude_key is None or file_key(path) != exclude_key:
                    visit(path, ancestors)
            elif entry.is_file():
                if entry.name.endswith(suffix):
                    found.append(path)
            elif entry.is_symlink():
                raise _broken_link(path)

    visit(folder, {})
    return found


def _glob_files(root: Path, parts: tuple[str, ...]) -> list[Path]:
    """The files below `root` matching the glob components `parts` (``*``, ``?``, ``[...]``
    within a name; ``**`` for any number of folders), links followed with the same rules as a
    folder (a cycle or a broken link is refused). As `glob.glob`, a wildcard does not match a
    name starting with a dot unless its pattern does."""
    found: set[Path] = set()

    def matches(name: str, pattern: str) -> bool:
        if name.startswith(".") and not pattern.startswith("."):
            return False
        return fnmatch.fnmatchcase(name, pattern)

    def expand(here: Path, rest: tuple[str, ...], ancestors: dict[FileKey, Path]) -> None:
        head, tail = rest[0], rest[1:]
        if head == "**":
            if tail:
                expand(here, tail, ancestors)
            for entry in _entries(here):
                path = here / entry.name
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    expand(path, rest, _enter(path, ancestors))
                elif not tail and entry.is_file():
                    found.add(path)
                elif entry.is_symlink() and not entry.is_dir() and not entry.is_file():
                    raise _broken_link(path)
            return
        if _GLOB_CHARS.isdisjoint(head):
            candidates = [here / head] if os.path.lexists(here / head) else []
        else:
            candidates = [here / e.name for e in _entries(here) if matches(e.name, head)]
        for path in candidates:
            if tail:
                if path.is_dir():
                    expand(path, tail, _enter(path, ancestors))
                elif path.is_symlink() and not path.exists():
                    raise _broken_link(path)
            elif path.is_file():
                found.add(path)
            elif path.is_symlink() and not path.exists():
                raise _broken_link(path)

    if parts and root.is_dir():
        expand(root, parts, _enter(root, {}))
    return sorted(found)


def _check_distinct_files(paths: list[Path]) -> None:
    """Refuse two input paths that name one file (links, hard links, bind mounts)."""
    seen: dict[FileKey, Path] = {}
    for path in paths:
        key = file_key(path)
        if key is None:
            continue
        other = seen.setdefault(key, path)
        if other != path:
            raise InputError(
                f"input shards {other} and {path} are the same file (a symbolic or hard link): "
                "its rows would be read twice; remove one of the links"
            )


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
        # base_dir is a literal path even if it holds '[' or '*': only `spec`'s own components
        # are patterns, from the first one holding a wildcard.
        root = _input_root(spec, base_dir)
        spec_parts = Path(spec).expanduser().parts
        num_static = next(i for i, part in enumerate(spec_parts) if not _GLOB_CHARS.isdisjoint(part))
        paths = _glob_files(root, tuple(p for p in spec_parts[num_static:] if p != "."))
        if not paths:
            raise InputError(
                f"no {_KINDS.get(suffix, suffix)} files match '{spec}' (resolved to {resolved})"
            )
    paths.sort()
    _check_distinct_files(paths)
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
    # The same checks by device and inode: another spelling of one folder (a bind mount, a
    # case-insensitive file system) passes the path comparisons above.
    out_above = _folder_keys(out_real)
    out_key = file_key(out_real)
    if not is_glob and file_key(root) in out_above:
        _refuse(out_dir, spec, "is" if file_key(root) == out_key else "lies inside", f"the input {root}")
    if out_key is not None:
        for p in input_paths:
            if out_key == file_key(p) or out_key in _folder_keys(Path(os.path.realpath(p)).parent):
                _refuse(out_dir, spec, "is the same folder as, or contains,", f"the input shard {p}")


def _folder_keys(path: Path) -> set[FileKey]:
    """The keys of `path` and of every folder above it that exists."""
    keys: set[FileKey] = set()
    for folder in (path, *path.parents):
        key = file_key(folder)
        if key is not None:
            keys.add(key)
    return keys


def _refuse(out_dir: Path, spec: str, relation: str, what: str) -> None:
    raise InputError(
        f"output.path {out_dir} {relation} {what} (input.path '{spec}'); output shards "
        "are named after input shards and --restart deletes them, so the output folder "
        "must lie outside the input set: choose another output.path"
    )
