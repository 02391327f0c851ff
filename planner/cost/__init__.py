"""Floor 2 - the physics of one layer on one GPU: FLOPs, time, bytes kept, communication, and the
cited constants they use. Imports core, model, hardware."""
