"""What a person sees of a run: progress, summaries, reports."""
