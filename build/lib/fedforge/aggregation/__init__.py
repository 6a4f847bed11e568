"""How the server combines a cohort's deltas: the weighted mean and its weight rules."""
