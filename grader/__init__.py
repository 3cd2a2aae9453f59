"""The grader: runs every task in its own process, scores it, writes Results.md and results.json."""
