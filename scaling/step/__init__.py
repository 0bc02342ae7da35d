"""The step model: FLOPs, memory, pipeline schedules, the kernels a step runs and their prices, the runtimes, and
program.predict, the one step model every command uses."""
