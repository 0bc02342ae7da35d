"""Orbax checkpoints of the sharded train state: saved on one mesh, restored on any other.

Orbax writes each step into a temporary directory and renames it only when every array is on disk
(``commit_success``), so a save interrupted half-way leaves no step that ``latest_step`` returns:
the previous complete checkpoint stays the latest. Restoring takes an abstract state (the
ShapeDtypeStructs of the target mesh, with their shardings), so a state saved on fsdp=4,tensor=2
restores bit-identically on fsdp=2,tensor=4 or on one device.
"""

from __future__ import annotations

import os
from pathlib import Path

import orbax.checkpoint as ocp


def open_manager(directory, *, create: bool, max_to_keep: int | None = 3) -> ocp.CheckpointManager:
    """A CheckpointManager over ``directory``. With ``create=False`` the directory must already hold
    checkpoints (ValueError otherwise, and nothing is created)."""
    path = Path(directory).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--checkpoint-dir {directory!r} is a file, not a directory")
    if not create:
        if not path.is_dir():
            raise ValueError(f"--checkpoint-dir {directory!r} does not exist: nothing to resume from")
    opts = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
    return ocp.CheckpointManager(os.fspath(path), options=opts)


def save(mngr: ocp.CheckpointManager, step: int, state, wait: bool = True) -> None:
    """Save ``state`` (a pytree of jax arrays) as ``step``; block until it is committed if ``wait``."""
    mngr.save(step, args=ocp.args.StandardSave(state), force=True)
    if wait:
        mngr.wait_until_finished()


def restore_latest(directory, abstract_state):
    """(step, state) of the newest complete checkpoint in ``directory``, restored onto the shardings
    of ``abstract_state``. ValueError if there is none or it cannot be read."""
    mngr = open_manager(directory, create=False)
    step = mngr.latest_step()
    if step is None:
        raise ValueError(f"--checkpoint-dir {directory!r} holds no complete checkpoint")
    try:
        state = mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # orbax raises many kinds of errors for damaged or mismatched files
        raise ValueError(f"checkpoint step {step} in {directory!r} cannot be restored: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        mngr.close()
    return step, state
