"""Privacy: DP stages and accounting, privacy tiers, secure aggregation."""
