"""The live web dashboard (``fedforge dashboard``): the runs of a runs directory
and, for each, its curves as it runs and its deployment server's live state.
Read-only: it reads run stores and live-state files, nothing else."""
