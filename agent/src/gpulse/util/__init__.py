"""Small helpers more than one stage needs (logging a recurring problem once, private files)."""
