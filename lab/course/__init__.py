"""Course mode: exercises cut from the real code and graded by its tests; docs/exercises.md explains it."""
