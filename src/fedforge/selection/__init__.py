"""Which clients work in which round: cohort sampling, upload periods, the
selection policies (uniform, power_of_choice, oort, fairness_floor,
deadline_aware, grouped_rotation) and what the server knows of each client."""
