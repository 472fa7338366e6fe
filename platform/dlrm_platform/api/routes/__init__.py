"""One module per resource: jobs, health, metrics."""
