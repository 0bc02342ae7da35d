"""The rules for one input value, in one place: how an integer or a number is written (ASCII only), and the
ranges of counts, figures and seeds that the model configs, the mesh shape, the schedule and every command
check (a ValueError naming the input and what would be valid). Pure Python and numpy, no other scaling module.
"""

from __future__ import annotations

import re

import numpy as np

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)", re.I)


def ascii_int(text: str) -> int:
    """``text`` as an int if it is written in ASCII digits (an optional sign), else ValueError: int() also reads
    full-width and other Unicode digits, and "1_000"."""
    s = str(text).strip()
    if not _INT.fullmatch(s):
        raise ValueError(f"invalid literal for an integer: {text!r}")
    return int(s)


def ascii_float(text: str) -> float:
    """``text`` as a float if it is written in ASCII (digits, '.', an exponent; nan and inf as words), else
    ValueError."""
    s = str(text).strip()
    if not _FLOAT.fullmatch(s):
        raise ValueError(f"invalid literal for a number: {text!r}")
    return float(s)


def positive_int(name: str, value) -> int:
    """Return ``value`` as an int if it is a positive integer, else raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def positive_ints(name: str, value):
    """``value`` if it is a positive integer or a numpy array of them (the planner evaluates many batch
    sizes at once), else ValueError naming ``name``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or not (value > 0).all():
            raise ValueError(f"{name} must hold positive integers, got {value!r}")
        return value
    return positive_int(name, value)


def non_negative_int(name: str, value) -> int:
    """Return ``value`` if it is an integer >= 0 (a seed, a count of warm-up steps), else raise
    ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


# Seeds are 32-bit: with jax's default 32-bit types, jax.random.key and flax's nnx.Rngs keep only a seed's
# low 32 bits (so seed 2**32 + 1 would repeat seed 1), and a seed of 2**63 or more overflows.
MAX_SEED = 2**32 - 1


def check_seed(name: str, value) -> int:
    """Return ``value`` if it is an integer in 0..MAX_SEED (2^32 - 1), else raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name} must be an integer in 0..{MAX_SEED} (a 32-bit seed), got {value!r}")
    return value


def positive_float(name: str, value) -> float:
    """Return ``value`` as a float if it is a finite positive number, else raise ValueError naming ``name``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not (v > 0 and v != float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def validated_copy(obj, **fields):
    """A shallow copy of the frozen dataclass ``obj`` (its own type) with ``fields`` set, validated by the caller:
    the rest, validated when ``obj`` was built, is not checked again (dataclasses.replace runs __post_init__ once
    more; the planner makes thousands of such copies a plan)."""
    out = object.__new__(type(obj))
    out.__dict__.update(obj.__dict__)
    for name, value in fields.items():
        object.__setattr__(out, name, value)
    return out
