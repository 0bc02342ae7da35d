"""The command layer, on top of verify (../DESIGN.md): one console script, ``jax-scaling``, with every command
as a subcommand (cli). It imports verify, and so jax, only when a command that compiles or measures runs.
"""
