"""What meterhub adds inside the notebook: the `public://` pool (issue 6)."""
