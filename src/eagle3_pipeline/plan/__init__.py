"""The estimates a run is checked against before it starts: storage, the draft, disk and
time (preflight's disk check and ``eagle3-plan``), from the target's shape alone."""
