"""Promotion and rollback of classifier models (the learning loop's training side)."""
