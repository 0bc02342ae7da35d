"""Closed-form scaling answers in the Scaling Book's notation: the bottom layer of the package.

Pure Python + numpy: importing ``scaling`` (any of its modules) never imports jax, nor the mesh, model
or verify packages (tests/test_layers.py). ``scaling.step.program.predict`` is the one step model; the
hardware table (``scaling.hardware.chips``) and the sharding table (``scaling.core.sharding``) are the one source
of each chip figure and each sharding rule.
"""

from scaling.families.ffn import FFNConfig
from scaling.core.mesh_shape import MeshShape, parse_mesh_spec
from scaling.core.policies import DEFAULT_PRECISION, Precision
from scaling.families.presets import PRESETS
from scaling.hardware.chips import CHIPS, get_chip

__all__ = ["CHIPS", "DEFAULT_PRECISION", "FFNConfig", "MeshShape", "PRESETS", "Precision", "get_chip",
           "parse_mesh_spec"]
