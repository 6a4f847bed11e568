"""Which clients work in which round: cohort sampling and upload periods."""
