"""``eagle3-remote``: what a DVC remote holds of this clone's ``dvc.lock``, named by
workspace file, and ``dvc push``/``dvc pull`` that say which file did not travel."""
