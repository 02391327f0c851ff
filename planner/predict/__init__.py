"""Floor 3 - one configuration's prediction: stage partition problem and split (stages.py), then
per-stage time and memory, step time and throughput (step.py). Imports floors 0-2."""
