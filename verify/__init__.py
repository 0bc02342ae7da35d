"""The comparison layer, below the command layer (jax_scaling): the closed forms (scaling) held against the
programs XLA compiles for the model (ffn_model) on a mesh (mesh). The only package that imports both sides.

  hlo     reading a compiled program: one dataclass (CompiledProgram) with dot FLOPs x loop trips,
          collectives by mesh axis, memory and cost analysis
  check   closed form beside compiled, term by term; plan verification
  grids   the check grids: the configurations the tests and notebooks compile (data only)
  cache   check's reports shared between processes by the call that made them ($VERIFY_CHECK_CACHE)
  bench   the measured step beside the compiled program's FLOPs and the closed form's prediction
  trace   seed 000's Ulysses layer (and a model's one layer) compiled; the command layer (jax_scaling) runs
          check, plan --verify-top, answer --verify-pipeline and trace --verify from check and trace
"""
