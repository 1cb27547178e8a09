"""Training code that is not the project's: examples of a team's own script run on the blueprint."""
