"""One migration per schema change, oldest first; each names the revision it follows (`down_revision`)."""
