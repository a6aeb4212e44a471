"""Course mode: exercises cut from the real code (python -m course make) and graded by its tests
(python -m course grade). course/exercises.py is the table; docs/exercises.md explains it."""
