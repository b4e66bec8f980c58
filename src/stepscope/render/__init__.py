"""render layer (see DESIGN.md)."""
