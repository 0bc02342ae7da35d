"""Orbax checkpoints of the sharded train state: saved on one mesh, restored on any other.

Step ``k`` holds the state after k train steps (so a resumed run starts at step k) and, as orbax step
metadata, what the data and model depend on: {"model": D, F, L, activation; "seed"; "batch_tokens";
"lr"}, and a checksum of every array (digest), which a restore compares. Resuming checks the model
and the seed, so a resumed run sees the same data as an uninterrupted one (the batch is a function
of (seed, step): ffn_model.train.make_batch_fn).

A step is complete when its directory holds orbax's commit marker (``commit_success.txt``, written
once every array is on disk) and its metadata file. A save cut off half-way leaves a
``<step>.orbax-checkpoint-tmp-*`` directory (on a local disk orbax renames it to ``<step>`` once the
save is complete) or, on object storage (gs://), a ``<step>`` directory without the marker, possibly
empty. A resume takes the newest complete step, says which newer saves it skipped and why
(skipped_lines) and removes them (remove_incomplete; orbax removes the ``*.orbax-checkpoint-tmp-*``
ones, also when an interrupted first save is all there is); a new run refuses a directory holding any
``<step>`` directory. Orbax 0.12.8 (the tested version) writes the marker on every file system; a
version that commits a local save by the rename alone writes none, and its steps read as incomplete.
The metadata carries a sha256 of itself (metadata_sum), checked before any of it is used: a changed
byte reads "metadata is corrupt", never a misleading "written with seed 1". A checkpoint without that
sum (written before it was added) is refused: nothing tells that its seed and model are the ones it
was saved with.
Reading checks the step's metadata and the stored shapes before any array is read, and turns
whatever orbax raises for damaged files into one ValueError, which names the newest older step that
reads intact and how to resume from it (--resume-step k: the steps after it are removed). Restoring
takes an abstract state (ShapeDtypeStructs with the target mesh's shardings), so a state saved on
fsdp=4,tensor=2 restores bit-identically on fsdp=2,tensor=4 or on one device.
In a multi-process program every process calls these functions; orbax coordinates the writes.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
import unicodedata

# Metadata keys that must match for a resumed run to continue the same run (the data and the model
# depend on them), and keys that may change but change the run: a resume with another value warns.
MUST_MATCH = ("model", "seed")
SHOULD_MATCH = ("batch_tokens", "lr", "schedule")
COMMIT_MARKER = "commit_success.txt"  # orbax's, in a step directory once the save is complete
METADATA_FILE = "_CHECKPOINT_METADATA"  # orbax's step metadata file (JSON), our metadata under "custom_metadata"
TMP = ".orbax-checkpoint-tmp"  # orbax's suffix of an unfinished save's directory
METADATA_SUM = "metadata_sha256"


def changed_settings(meta: dict, expect: dict) -> list[str]:
    """One line for each SHOULD_MATCH key whose value in ``expect`` (this run) differs from the
    checkpoint's ``meta``: "batch_tokens 128, the checkpoint was written with 64"."""
    return [f"{key} {expect[key]!r}, the checkpoint was written with {meta[key]!r}"
            for key in SHOULD_MATCH if key in meta and key in expect and meta[key] != expect[key]]


def _quiet_unraisable(unraisable, previous):
    """Drop what orbax's abandoned reads of a damaged checkpoint report after the read has failed
    (the read's own error is what we report): tensorstore callbacks on the closed event loop, from
    its own threads, and orbax read coroutines collected unfinished. Pass anything else to
    ``previous``, the hook that was installed before."""
    code = getattr(unraisable.object, "cr_code", None)
    orbax_read = "orbax" in getattr(code, "co_filename", "")
    closed_loop = unraisable.exc_type is RuntimeError and "Event loop is closed" in str(unraisable.exc_value)
    if not (orbax_read or closed_loop):
        previous(unraisable)


@contextlib.contextmanager
def _reading():
    """While orbax reads a checkpoint that may be damaged, and until the reads it abandons on a failure
    are collected (_attempt), its absl warnings and errors, asyncio's reports of those reads' exceptions
    nobody retrieved and their unraisable reports (_quiet_unraisable) are not shown: the caller turns
    the failure into one ValueError. Everything is put back as it was when the block ends."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [lg.level for lg in loggers]
    hook = sys.unraisablehook
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    sys.unraisablehook = functools.partial(_quiet_unraisable, previous=hook)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        sys.unraisablehook = hook


def _ocp():
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        raise ValueError("--checkpoint-dir needs orbax-checkpoint: pip install -e '.[checkpoint]'") from None
    return ocp


def _path(directory):
    """``directory`` as an etils path (what orbax uses): a local path made absolute, or a URL such as
    gs://bucket/run (which every host of a slice can reach) as it is. ValueError for anything else, and
    for a name holding a control character (a newline, a tab, an escape, ...)."""
    from etils import epath

    if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
        raise ValueError(f"--checkpoint-dir must be a directory path, got {directory!r}")
    s = os.fspath(directory)
    control = [c for c in str(s) if unicodedata.category(c) == "Cc"]
    if control:
        raise ValueError(f"--checkpoint-dir {str(s)!r} holds a control character ({control[0]!r}); "
                         "give a path of printable characters")
    return epath.Path(s) if "://" in s else epath.Path(os.path.abspath(s))


def directory_contents(directory) -> dict:
    """What a checkpoint directory holds, read from the file system alone (no orbax, no jax, so it is
    safe before jax's devices are set up): {"steps": complete steps (step_problem), "incomplete":
    [(step, name, why)] for each save of a step that never completed, a ``<k>`` directory or a
    ``<k>.orbax-checkpoint-tmp-*`` one, "unfinished": the names of the ``*.orbax-checkpoint-tmp*`` ones,
    "other": every other entry}. A directory that does not exist holds nothing."""
    path = _path(directory)
    out = {"steps": [], "incomplete": [], "unfinished": [], "other": []}
    if not path.is_dir():
        return out
    for entry in sorted(path.iterdir(), key=lambda e: e.name):
        name = entry.name
        if name.isdigit() and entry.is_dir():
            why = step_problem(entry)
            if why is None:
                out["steps"].append(int(name))
            else:
                out["incomplete"].append((int(name), name, why))
        elif TMP in name:
            out["unfinished"].append(name)
            if name.split(TMP)[0].isdigit():
                out["incomplete"].append((int(name.split(TMP)[0]), name, f"unfinished save {name}"))
        else:
            out["other"].append(name)
    out["steps"].sort()
    out["incomplete"].sort()
    return out


def step_problem(step_dir) -> str | None:
    """Why the step directory ``step_dir`` (an etils path) is not a complete checkpoint, or None when it
    is: it is empty, or lacks orbax's commit marker or its metadata file (an interrupted save)."""
    names = {e.name for e in step_dir.iterdir()}
    if not names:
        return "empty directory"
    if COMMIT_MARKER not in names:
        unfinished = sorted(n for n in names if TMP in n)
        return f"no commit marker ({COMMIT_MARKER})" + (f", unfinished {unfinished[0]}" if unfinished else "")
    if METADATA_FILE not in names:
        return f"no metadata ({METADATA_FILE})"
    return None


def skipped_lines(held: dict, step: int) -> list[str]:
    """"skipped step k: why" for each incomplete save of ``held`` (directory_contents) newer than ``step``."""
    return [f"skipped step {k}: {why}" for k, _, why in held["incomplete"] if k > step]


def check_directory(directory, resume: bool) -> None:
    """Validate ``directory`` before anything is written: a directory this process can write in (or
    create: check_writable); with ``resume`` it must exist (restore_latest then says whether it holds
    a complete checkpoint); without ``resume`` it must be missing or empty: checkpoints already there
    (complete or not) would be mixed with, or replaced by, a new run's, and files that are not
    checkpoints are not this run's to write beside. Unfinished saves (``*.orbax-checkpoint-tmp*``, an
    interrupted save, possibly the run's first) do not count: the run removes them (open_manager).
    ValueError naming the directory otherwise. Reads the file system only (directory_contents); creates
    nothing that outlives the call."""
    path = _path(directory)
    check_writable(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--checkpoint-dir {str(directory)!r} is a file, not a directory")
    if resume and not path.is_dir():
        raise ValueError(f"--checkpoint-dir {str(directory)!r} does not exist: nothing to resume from")
    if resume:
        return
    held = directory_contents(directory)
    numbered = held["steps"] + [k for k, name, _ in held["incomplete"] if name.isdigit()]
    if numbered:
        raise ValueError(f"--checkpoint-dir {str(directory)!r} already holds checkpoints (latest step "
                         f"{max(numbered)}); pass --resume to continue that run, or give an empty or new directory")
    if held["other"]:
        shown = ", ".join(held["other"][:3]) + (", ..." if len(held["other"]) > 3 else "")
        raise ValueError(f"--checkpoint-dir {str(directory)!r} holds files that are not checkpoints ({shown}); "
                         "give an empty or new directory")


def check_writable(directory) -> None:
    """ValueError (one line naming ``directory`` and the reason) unless this process can create, read
    and write ``directory``: a URL needs its file system's package (gs:// needs gcsfs); a local path
    must lead to a directory, or to nothing below a directory, through no file, loop or dangling link,
    and that directory must take a new entry: os.access, then a probe (a temporary directory made and
    removed at once, the directory's times put back; it catches what os.access cannot: /proc, /sys,
    where root's override of the mode bits does not reach)."""
    where = f"--checkpoint-dir {str(directory)!r}"
    path = _path(directory)
    if "://" in str(path):
        try:
            path.exists()
        except ImportError as e:  # etils: "Please install gcsfs to access Google Storage"
            raise ValueError(f"{where}: {str(e).strip()}") from None
        return
    target = os.fspath(path)
    while not os.path.lexists(target):  # the nearest entry that exists: the directory, or the one to create it in
        target = os.path.dirname(target)
    try:
        is_dir = os.path.isdir(os.path.realpath(target, strict=True))
    except OSError as e:  # a dangling link, a loop
        raise ValueError(f"{where}: {target!r}: {e.strerror}") from None
    if not is_dir:
        raise ValueError(f"{where}: {target!r} is a file, not a directory")
    if not os.access(target, os.R_OK | os.W_OK | os.X_OK):
        raise ValueError(f"{where}: no permission to read and write in {target!r}")
    before = os.stat(target)
    try:
        tempfile.TemporaryDirectory(dir=target, prefix=".ffn_model-probe-").cleanup()
    except OSError as e:
        raise ValueError(f"{where}: cannot write in {target!r}: {e.strerror}") from None
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # the probe leaves no trace, its time included


def open_manager(directory, *, create: bool, max_to_keep: int | None = 3):
    """An orbax CheckpointManager over ``directory`` keeping the newest ``max_to_keep`` steps. With
    ``create=True`` it creates the directory and removes unfinished saves (``*.orbax-checkpoint-tmp``);
    with ``create=False`` the directory must already exist (ValueError otherwise) and nothing is written."""
    ocp = _ocp()
    path = _path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--checkpoint-dir {str(directory)!r} is a file, not a directory")
    if not create and not path.is_dir():
        raise ValueError(f"--checkpoint-dir {str(directory)!r} does not exist: nothing to resume from")
    # cleanup_tmp_directories: a new run's manager removes what an interrupted save left behind
    opts = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create, cleanup_tmp_directories=create)
    return ocp.CheckpointManager(path, options=opts, item_handlers=ocp.StandardCheckpointHandler())


def save(mngr, step: int, state, meta: dict | None = None, wait: bool = True) -> None:
    """Save ``state`` (a pytree of jax arrays) as ``step`` with ``meta``, the state's checksums (digest)
    and the sha256 of both (metadata_sum) as its step metadata. ValueError, and nothing saved, if an array
    holds a value that is not finite. Orbax copies the arrays to host before returning, so the caller may
    donate them to the next train step; the files are written in the background unless ``wait``
    (``mngr.is_saving_in_progress`` says when the step is committed)."""
    ocp = _ocp()
    sums, bad = digest(state)
    if bad:
        raise ValueError(f"step {step}: the state holds values that are not finite ({', '.join(bad[:3])}); "
                         "not saved")
    custom = {**(meta or {}), "checksums": sums}
    mngr.save(step, args=ocp.args.StandardSave(state), custom_metadata={**custom, METADATA_SUM: metadata_sum(custom)},
              force=True)
    if wait:
        mngr.wait_until_finished()


def metadata_sum(meta: dict) -> str:
    """The sha256 (hex) of ``meta`` without its own sum (METADATA_SUM), as canonical JSON: keys sorted, no
    spaces (what JSON reads back, tuples as lists, gives the same text)."""
    body = {k: v for k, v in meta.items() if k != METADATA_SUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def remove_incomplete(mngr, held: dict, step: int) -> list[str]:
    """Remove the ``<k>`` directories of incomplete saves newer than ``step`` (directory_contents' ``held``)
    that ``mngr`` (open_manager) counts as steps, so that this run saves those steps anew (orbax refuses a
    step that exists); the names removed. Orbax removes the ``*.orbax-checkpoint-tmp*`` ones itself."""
    known = set(mngr.all_steps())
    gone = [name for k, name, _ in held["incomplete"] if k > step and name.isdigit() and k in known]
    for name in gone:
        mngr.delete(int(name))
    return gone


def remove_newer(mngr, held: dict, step: int) -> list[int]:
    """Remove the complete steps of ``held`` (directory_contents) newer than ``step`` (a run resumed from an older
    step, --resume-step, saves those steps anew: orbax refuses a step that exists); the steps removed."""
    known = set(mngr.all_steps())
    gone = [k for k in held["steps"] if k > step and k in known]
    for k in gone:
        mngr.delete(k)
    return gone


def digest(state) -> tuple[dict, list[str]]:
    """({leaf path: checksum}, [paths of leaves holding a NaN or an infinity]) of a pytree of jax arrays.
    A leaf's checksum is the sum mod 2^32 of its elements read as unsigned integers of their width: a
    flipped bit b of one element changes the sum by ±2^b (b < 32), never by a multiple of 2^32, so any
    single flipped bit shows; integer addition is exact in any order, so the sum is the same on every
    mesh. One jitted pass over the arrays where they are (each device sums its shards)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    mesh = getattr(flat[0][1].sharding, "mesh", None) if flat else None
    out = None if mesh is None else NamedSharding(mesh, PartitionSpec())  # replicated: every process reads it
    got = jax.device_get(_digest_fn(out)([a for _, a in flat]))
    names = [jax.tree_util.keystr(p) for p, _ in flat]
    return {n: int(t) for n, (t, _) in zip(names, got)}, [n for n, (_, f) in zip(names, got) if not f]


@functools.lru_cache(maxsize=None)
def _digest_fn(out_sharding):
    """The jitted digest of a list of arrays: [(checksum uint32, all finite)] (one per output sharding, so
    every save after the first reuses the compiled program)."""
    import jax
    import jax.numpy as jnp

    def leaf(a):
        width = {1: jnp.uint8, 2: jnp.uint16}.get(a.dtype.itemsize, jnp.uint32)  # 8 bytes: two uint32 words
        total = jnp.sum(jax.lax.bitcast_convert_type(a, width).astype(jnp.uint32), dtype=jnp.uint32)
        finite = jnp.all(jnp.isfinite(a)) if jnp.issubdtype(a.dtype, jnp.inexact) else jnp.bool_(True)
        return total, finite

    return jax.jit(lambda xs: [leaf(x) for x in xs], out_shardings=out_sharding)


class _Damaged(ValueError):
    """A complete step whose files changed after its save (its metadata or arrays do not match the sums saved with
    them, or orbax cannot read them), as opposed to one written for another run: an older step may be intact."""


def restore_latest(directory, abstract_state, expect: dict | None = None, step: int | None = None):
    """(step, state, metadata) of the newest complete checkpoint in ``directory`` (directory_contents:
    newer incomplete saves are passed over), or of the complete ``step`` where given (--resume-step),
    restored onto the shardings of ``abstract_state``.
    ``expect``: metadata the checkpoint must match for the keys in MUST_MATCH (model and seed).
    ValueError if there is no complete checkpoint (naming the incomplete ones), ``step`` is not a complete
    one, its metadata is not what was saved (stored_metadata), it was written for another model or seed, its
    arrays have other shapes or dtypes, it cannot be read, or what was read differs from the checksums saved
    with it or is not finite (damaged files: digest). A damaged step's error names the newest older step that
    reads intact and how to resume from it (newest_intact). Writes nothing."""
    with _reading(), contextlib.closing(open_manager(directory, create=False)) as mngr:
        held = directory_contents(directory)
        if not held["steps"]:
            raise ValueError(f"no complete checkpoint in --checkpoint-dir {str(directory)!r}"
                             + "".join(f"; step {k}: {why}" for k, _, why in held["incomplete"]))
        if step is None:
            step = held["steps"][-1]
        check_resume_step(directory, step, held)
        try:
            state, meta = _read_step(mngr, directory, step, abstract_state, expect)
        except _Damaged as e:
            raise ValueError(f"{e}{newest_intact(mngr, directory, held, step, abstract_state, expect)}") from None
    return step, state, meta


def check_resume_step(directory, step: int, held: dict | None = None) -> None:
    """ValueError (one line naming --resume-step and the complete steps there are) unless ``step`` is a complete
    step of ``directory`` (directory_contents, or ``held``: what it returned). Reads the file system only."""
    held = directory_contents(directory) if held is None else held
    if step not in held["steps"]:
        have = ", ".join(map(str, held["steps"])) or "none"
        raise ValueError(f"--resume-step {step}: --checkpoint-dir {str(directory)!r} holds no complete checkpoint "
                         f"step {step} (complete steps: {have})")


def newest_intact(mngr, directory, held: dict, step: int, abstract_state, expect) -> str:
    """What to say after step ``step``'s damage: "; step k is intact: resume from it with --resume-step k (...)"
    for the newest complete step k < ``step`` that reads and matches its checksums (each older one read in turn,
    newest first, as restore_latest reads a step: _read_step), "; the older steps ... are damaged too ..." where
    none does, "" where there is no older complete step."""
    older = [k for k in held["steps"] if k < step]
    for k in reversed(older):
        try:
            _read_step(mngr, directory, k, abstract_state, expect)
        except ValueError:
            continue
        return (f"; step {k} is intact: resume from it with --resume-step {k} (the checkpoints after it are "
                "removed)")
    return (f"; the older steps ({', '.join(map(str, older))}) are damaged too: start anew in an empty "
            "--checkpoint-dir") if older else ""


def _read_step(mngr, directory, step: int, abstract_state, expect):
    """(state, metadata) of the complete ``step``, checked as restore_latest says; _Damaged where its files
    changed after the save, ValueError where it belongs to another run or another state."""
    ocp = _ocp()
    where = f"in --checkpoint-dir {str(directory)!r}"
    try:
        meta = stored_metadata(directory, step)
    except ValueError as e:
        raise _Damaged(str(e)) from None
    md, err = _attempt(lambda: mngr.metadata(step), directory)
    if err:
        raise _Damaged(f"checkpoint step {step} {where} cannot be read: {err}")
    for key in MUST_MATCH if expect is not None else ():
        if key not in meta:
            raise ValueError(f"checkpoint step {step} {where} has no {key!r} in its metadata: "
                             "not written by ffn_model train, or damaged")
        if meta[key] != expect[key]:
            raise ValueError(f"checkpoint step {step} {where} was written with {key} {meta[key]!r}, "
                             f"not {expect[key]!r}; resume with the same {key}")
    _check_arrays(md.item_metadata, abstract_state, f"checkpoint step {step} {where}")
    state, err = _attempt(lambda: mngr.restore(step, args=ocp.args.StandardRestore(abstract_state)), directory)
    if err:  # damaged array files
        raise _Damaged(f"checkpoint step {step} {where} cannot be restored: {err}")
    sums, bad = digest(state)
    saved = meta.get("checksums") or {}
    damaged = [n for n, c in sums.items() if n in saved and saved[n] != c]
    if damaged or bad:  # files changed after the save (a checkpoint written before checksums: finiteness only)
        raise _Damaged(f"checkpoint step {step} {where} is damaged: "
                       + (f"{damaged[0]} does not match the checksum saved with it" if damaged
                          else f"{bad[0]} holds values that are not finite"))
    return state, meta


def stored_metadata(directory, step: int) -> dict:
    """The metadata saved with ``step`` (save), read from its metadata file and checked against the sha256
    saved in it (metadata_sum). ValueError, one line, when the file is not JSON, the sum differs ("metadata
    is corrupt"), or there is none (a checkpoint written before the sum: refused, since nothing tells its
    metadata is the one it was saved with)."""
    where = f"in --checkpoint-dir {str(directory)!r}"
    try:
        meta = json.loads((_path(directory) / str(step) / METADATA_FILE).read_text())["custom_metadata"]
        saved = meta[METADATA_SUM]
    except KeyError:
        raise ValueError(f"checkpoint step {step} {where} has no metadata checksum ({METADATA_SUM}): written "
                         "before ffn_model checked its metadata, or damaged; not restored") from None
    except (OSError, ValueError, TypeError) as e:  # not JSON, or JSON of another shape
        raise ValueError(f"checkpoint step {step}'s metadata is corrupt ({_first_line(e)}) {where}") from None
    got = metadata_sum(meta)
    if got != saved:
        raise ValueError(f"checkpoint step {step}'s metadata is corrupt (checksum sha256 {got[:16]}..., "
                         f"saved with it {str(saved)[:16]}...) {where}")
    return meta


def _check_arrays(item_metadata, abstract_state, what: str) -> None:
    """The stored arrays (orbax's item metadata) have the abstract state's leaves, shapes and dtypes;
    ValueError naming the first that differs. Checked before restoring, so orbax never starts reads
    that are bound to fail."""
    import jax
    import numpy as np

    want = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
    have = jax.tree.leaves(getattr(item_metadata, "tree", item_metadata))
    if len(have) != len(want):
        raise ValueError(f"{what} holds {len(have)} arrays, this run's state {len(want)}")
    for (path, a), h in zip(want, have):
        if tuple(h.shape) != tuple(a.shape) or np.dtype(h.dtype) != np.dtype(a.dtype):
            raise ValueError(f"{what} holds {jax.tree_util.keystr(path)} as {np.dtype(h.dtype)}{list(h.shape)}, "
                             f"this run needs {np.dtype(a.dtype)}{list(a.shape)}")


def _attempt(read, directory):
    """(read(), None), or (None, "Type: first line of the error", paths in ``directory`` relative to it: the
    message names the directory once) when orbax fails (it raises many
    kinds of errors for damaged files). After a failure it waits for the reads orbax abandoned and
    collects them here, so their late reports (see _quiet_unraisable) come now, not at a random
    later moment of the program (a garbage collection inside, say, an import)."""
    try:
        return read(), None
    except Exception as e:
        err = _first_line(e, within=directory)
    for _ in range(5):  # inside _reading, which keeps their reports quiet until it ends
        time.sleep(0.1)
        gc.collect()
    return None, err


def _first_line(e: Exception, limit: int = 300, within=None) -> str:
    """The error's type and first line, without tensorstore's spec dump, at most ``limit`` characters; paths under
    the directory ``within`` relative to it (a long directory name would leave no room for the file's)."""
    text = str(e).strip()
    line = text.splitlines()[0].split(" [tensorstore_spec=")[0] if text else ""
    if within is not None:
        for root in sorted({str(within), os.path.abspath(within)}, key=len, reverse=True):  # the absolute first
            line = line.replace(root.rstrip("/") + "/", "")
    return f"{type(e).__name__}: {line[:limit]}"
