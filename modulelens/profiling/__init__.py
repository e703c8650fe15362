"""Fair measurement: established timers, spread not single numbers, stated cache state."""
