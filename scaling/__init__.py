"""Closed-form scaling answers for a sharded FFN stack (Scaling Book notation).

Pure Python + numpy: importing ``scaling`` never imports jax. The only modules that touch jax
(``scaling.hlo``, ``scaling.check``) import it lazily and are not imported here.
"""

from scaling.config import DEFAULT_PRECISION, PRESETS, FFNConfig, MeshShape, Precision, parse_mesh_spec
from scaling.hardware import CHIPS, get_chip

__all__ = ["CHIPS", "DEFAULT_PRECISION", "FFNConfig", "MeshShape", "PRESETS", "Precision", "get_chip", "parse_mesh_spec"]
