"""Profile catalog and spawner backends; knows nothing of money."""
