"""Low-level cogs shared by every kopf distribution: structures, settings sections, async primitives."""
