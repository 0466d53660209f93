"""Training data on disk: HDF5 and Megatron indexed shards, weighted blends, the sample schedule."""
