"""A real vLLM server for tests and benches: a tiny random Llama written locally, served on 127.0.0.1."""
