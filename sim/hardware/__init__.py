"""What a replica runs on: GPU specs (:mod:`.gpus`), model specs (:mod:`.models`), and how many KV
blocks fit in the memory left after the weights (:mod:`.kv_capacity`)."""
