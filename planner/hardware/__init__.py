"""Floor 1 - what it runs on: GPU profiles (peak rates, memory, links) and the cluster built from
them. Imports only planner.core."""
