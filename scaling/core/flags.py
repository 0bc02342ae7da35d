"""XLA flag sets: what every compile passes to the compiler, and how the compiled schedule overlaps the
collectives under it. The sets live in scaling/data/xla_flags.toml (one table per set, with its source); a
user's own flags ("--name=value ...") make a set of their own.

Flags reach XLA per compile, as jax's ``compiler_options`` (``Lowered.compile(compiler_options=...)``), not
through LIBTPU_INIT_ARGS, which libtpu reads once per process: one process compiles under several sets.
XLA:TPU rejects a flag it does not know (INVALID_ARGUMENT "No such compile option"); XLA:CPU does not know
libtpu's flags, so a CPU compile gets none of them (its collectives are synchronous under every set).
"""

from __future__ import annotations

import enum
import re
import tomllib
from dataclasses import dataclass
from importlib import resources

from scaling.core.kinds import Platform

# The commands' default (--xla-flags): what MaxText's production v5p scripts pass. From Python a Workload's flags
# default to LIBTPU_DEFAULTS, what jax.jit compiles with when nobody passes any.
DEFAULT_FLAGS = "maxtext"
LIBTPU_DEFAULTS = "default"


class Gathers(enum.StrEnum):
    """How XLA:TPU schedules the FSDP weight all-gathers of a scanned stack (scaling/data/xla_flags.toml)."""
    EXPOSED = "exposed"
    WITHIN_BLOCK = "within-block"
    ACROSS_BLOCKS = "across-blocks"


@dataclass(frozen=True)
class FlagSet:
    """One flag set: ``name``, the ``flags`` ("--name=value"), their ``source``, and what the compiled
    programs do with them: ``gathers`` (Gathers) and whether the windowed-einsum reduce-scatter leaves the
    last hop of one ring exposed (``rs_last_hop_exposed``)."""

    name: str
    flags: tuple[str, ...] = ()
    source: str = ""
    gathers: Gathers = Gathers.EXPOSED
    rs_last_hop_exposed: bool = False

    def options(self, platform: str) -> dict[str, str]:
        """jax compiler_options for a compile on ``platform``: the flags as {name: value} on TPU; none on
        CPU or GPU (the sets hold libtpu flags)."""
        return dict(_split(f) for f in self.flags) if platform == Platform.TPU else {}

    def on(self, platform: str) -> FlagSet:
        """The set as a compile on ``platform`` runs it: itself on TPU; elsewhere (XLA:CPU, a GPU) none of its
        flags reach XLA (options) and every collective runs synchronously."""
        return self if platform == Platform.TPU else FlagSet(self.name, self.flags, self.source)

    def describe(self) -> str:
        """One line for a report's header."""
        return f"XLA flags {self.name!r} ({len(self.flags)} flags; FSDP gathers {self.gathers})"


def _split(flag: str) -> tuple[str, str]:
    m = re.fullmatch(r"--?([A-Za-z_][\w.]*)(?:=(.*))?", flag)
    if not m:
        raise ValueError(f"XLA flag {flag!r} is not of the form --name=value")
    return m.group(1), "true" if m.group(2) is None else m.group(2)


def _load() -> dict[str, FlagSet]:
    with resources.files("scaling").joinpath("data/xla_flags.toml").open("rb") as f:
        table = tomllib.load(f)
    return {name: FlagSet(name, tuple(t["flags"]), " ".join(t["source"].split()), Gathers(t["gathers"]),
                          t["rs_last_hop"] == "exposed") for name, t in table.items()}


FLAG_SETS: dict[str, FlagSet] = _load()


def get_flag_set(spec: str | FlagSet | None = None) -> FlagSet:
    """A named set (FLAG_SETS), or the user's flags "--name=value ..." as a set named by them; None: LIBTPU_DEFAULTS.
    The user's set schedules as the named set with the most flags all of whose flags it holds (the behaviour
    read from programs), else as "default". ValueError naming an unknown set or a malformed flag."""
    if isinstance(spec, FlagSet):
        return spec
    spec = LIBTPU_DEFAULTS if spec is None else str(spec).strip()
    if spec in FLAG_SETS:
        return FLAG_SETS[spec]
    if not spec.startswith("-"):
        raise ValueError(f"unknown XLA flag set {spec!r}; use one of {', '.join(FLAG_SETS)} "
                         "or flags '--name=value ...'")
    flags = tuple(spec.split())
    given = set(flags)
    for f in flags:
        _split(f)
    like = max((s for s in FLAG_SETS.values() if set(s.flags) <= given), key=lambda s: len(s.flags))
    return FlagSet(" ".join(flags), flags, f"the user's flags, scheduled as {like.name!r}", like.gathers,
                   like.rs_last_hop_exposed)


def check_modelled(fs: FlagSet, command: str) -> FlagSet:
    """``fs`` if the step model reads every one of its flags (each is in a named set of FLAG_SETS, whose schedules
    were read from compiled programs), else ValueError naming the first that is not: a command that predicts
    without compiling (predict, plan, kernels) would print a step that does not depend on it."""
    known = {f for s in FLAG_SETS.values() for f in s.flags}
    if unread := [f for f in fs.flags if f not in known]:
        raise ValueError(f"{command} models the XLA flags of the sets {', '.join(FLAG_SETS)} (scaling/data/"
                         f"xla_flags.toml); {unread[0]} is in none of them, so the step it predicts would not depend "
                         "on it (check and compile pass any flag to XLA, which refuses the ones it does not know)")
    return fs


def unknown_flag(error: BaseException | str) -> str | None:
    """The flag named by XLA's refusal of a compile option it does not know, else None."""
    m = re.search(r"No such compile option: '([^']+)'", str(error))
    return m.group(1) if m else None
