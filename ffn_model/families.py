"""The one map from a model family (its config's ``family`` ClassVar, scaling.families.presets.FAMILIES) to the module
that builds its program. Each module exposes the same functions, which are all the train step asks of a family:

    build(w, seed)                  the NNX module of the workload
    input_layout(cfg, batch_tokens) (shape, logical axes) of a batch's x and y
    batch_dtypes(cfg)               (x, y) element types
    synthetic_batch(cfg, shape, seed)  step -> batch (not jitted)
    loss(model, batch)              the module's loss on one batch
    pipeline_loss_fn(w, mesh, for_grad)  (params, batch) -> loss with a stage axis

A new family is one closed-form module (scaling) and one program module here.
"""

from __future__ import annotations

from types import ModuleType

from ffn_model import model, moe, transformer

PROGRAMS = {"ffn": model, "transformer": transformer, "moe": moe}


def program(cfg) -> ModuleType:
    """The program module of ``cfg``'s family (PROGRAMS[cfg.family])."""
    return PROGRAMS[cfg.family]
