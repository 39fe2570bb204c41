"""What a run measured: the recorder the engine writes into (:mod:`.recorder`), the request and step
frames (:mod:`.requests`, :mod:`.steps`), token times (:mod:`.token_times`), and the summary
(:mod:`.summary`)."""
