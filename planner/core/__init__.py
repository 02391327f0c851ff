"""Floor 0 - the shared vocabulary: error types, units, safe file I/O and the plan types
(Parallel, Stage, Metrics, Plan); and what guards every input and output (issue #12): bounded
JSON reading (jsonfile), strict schemas (schema, plan_schema), name checks and terminal-safe text
(text), the caps on work (limits), all-or-nothing file sets (fileset; swap_recovery for a writer
killed mid-swap). Imports nothing else from planner."""
