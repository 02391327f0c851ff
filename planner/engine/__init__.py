"""Run a plan on a real engine: a reference decoder built from plan.json alone, split into the
plan's stages and stepped by ``torch.distributed.pipelining``.

Floor 5 (beside the searches that produce plans): it reads only the plan.json document, never the
planner's cost model, so what it runs is what an engine would be given. torch is optional
(``pip install 'plan3d[engine]'``); nothing here imports it until a model is built.
"""
