"""Data files: catalogue, icons, fonts."""
