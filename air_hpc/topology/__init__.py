"""The fabric: one model of switches and nodes, its importers and writers, node selection and rank placement."""
