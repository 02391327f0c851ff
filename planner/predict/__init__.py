"""Floor 3 - one configuration's prediction: stage partition problem and split (stages.py), the
layers' costs (layer_costs.py) summed over a split's chunks (chunks.py), then per-stage time and
memory (memory.py), the pipeline schedule's time (pipeline_schedule.py), the data-parallel sync
(data_parallel.py), and the step time and throughput they add up to (step.py). Imports floors
0-2."""
