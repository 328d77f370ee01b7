"""``eagle3-plan``: the full picture of a run before it starts (modes, weights, commands)."""
