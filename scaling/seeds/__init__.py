"""The reference seeds' reproductions (000, 001's layer estimator, 002)."""
