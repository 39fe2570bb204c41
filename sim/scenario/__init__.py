"""Scenarios: the validated YAML schema (:mod:`.schema`), ``--set`` overrides (:mod:`.overrides`),
one-line error messages (:mod:`.errors`), the key reference (:mod:`.docs`), and the one place a
scenario is resolved into the engine's model, GPU, limits and KV capacity (:mod:`.resolved`)."""
