"""meterhub hub side: site config, the CLI, pages and the wiring of hooks."""
