"""HTTP emulators of the StarRocks and Doris load protocols (test doubles)."""
