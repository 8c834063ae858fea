"""Code that runs inside a vLLM server, not in the trainer: the server imports `tirl_weight_receiver` as a
top-level module (this directory is put on its PYTHONPATH), so nothing here imports tirl."""
