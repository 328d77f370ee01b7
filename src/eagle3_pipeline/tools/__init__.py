"""Tools: the commands a user runs beside the pipeline (``eagle3-fetch``, ``eagle3-remote``,
``eagle3-compare``, ``eagle3-compose``, ``eagle3-check-draft``, the stock recipe's CLI that
``bench/recipe.py`` drives).

Why a layer of their own, above ``stages/``: a DVC stage depends on exactly the modules it
imports (``dvc.yaml``'s code deps are generated from the import graph), and no stage
imports a tool, so editing a tool reruns nothing. Tools may import anything below them;
nothing below imports a tool (``tests/pipeline/test_layers.py``).
"""
