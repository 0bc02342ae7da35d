"""The vocabulary every layer speaks: inputs, mesh shapes, policies and kinds, schedules, sharding rules, flag sets,
the model-family protocol, the workload and the limits of what can be built."""
