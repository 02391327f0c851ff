"""Floor 1 - what is trained: model specs from model.json, HuggingFace config.json or a preset,
as a sequence of layers the planner can split. Imports only planner.core."""
