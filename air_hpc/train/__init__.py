"""Inside the job: parallel state, the GPT model, building HDF5 data, the training loop and its metrics."""
