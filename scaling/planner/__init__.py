"""The planner: every mesh, batch split, policy and schedule of a slice, ranked by the step model."""
