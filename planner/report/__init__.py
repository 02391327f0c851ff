"""Floor 7 - rich rendering of plans, partitions, layouts, profiles and Gantt charts; no
planning logic. Imports floors 0-6."""
