"""Auto: the cost model, the calibration that feeds it, the choice among draft sources, and
the scheduler that plans every step and explains its plan."""
