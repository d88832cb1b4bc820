"""The bottom layer: errors and tensor invariants that every other package may import."""
