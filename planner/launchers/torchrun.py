"""torchrun + Slurm: ``launch.sh`` (one torchrun per node) and ``job.sbatch`` (srun of it).

Targets torchrun from PyTorch 2.1+ (``--nnodes --nproc-per-node --node-rank --rdzv-backend c10d
--rdzv-endpoint --rdzv-id``) and Slurm 21.08+ (``--gpus-per-node``). With c10d rendezvous the
agents agree on node order themselves; every node still gets a contiguous block of
``nproc-per-node`` ranks, which is all the node-local TP layout needs.

The training command is the user's: ``TRAIN_SCRIPT`` (default by what was exported beside it:
``pretrain_gpt.py`` with megatron_args.sh, ``-m torchtitan.train`` with torchtitan.toml, else
``train.py``) followed by ``TRAIN_ARGS``; the Megatron arguments and torchtitan config found next
to launch.sh are appended.
"""

from __future__ import annotations

import re

from planner.launchers.common import Facts, header, structure_problems
from planner.predict.plan import Plan

TARGET = "torchrun (PyTorch 2.1+) with c10d rendezvous"
NAME = "torchrun"
SBATCH_TARGET = "Slurm 21.08+ sbatch (one task per node running launch.sh)"
DEFAULT_PORT = 29500


def check(plan: Plan) -> list[str]:
    return structure_problems(plan)


def parallel_rules(_facts: Facts) -> list[str]:
    """torchrun runs any degrees; the GPU count is checked against the cluster in ``check``."""
    return []


def _launch(plan: Plan) -> str:
    cl, par = plan.cluster, plan.parallel
    tp_env = "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron asserts this when tp > 1\n" \
        if par.tp > 1 else ""
    return (
        "#!/usr/bin/env bash\n"
        + header(plan, TARGET)
        + "# Run once per node: NODE_RANK=<0..NNODES-1> MASTER_ADDR=<node 0 host> ./launch.sh\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n\n'
        f"NNODES={cl.nodes}\n"
        f"NPROC_PER_NODE={cl.gpus_per_node}  # world size {par.gpus} = "
        f"tp {par.tp} x pp {par.pp} x dp {par.dp}\n"
        'NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"\n'
        'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"\n'
        'RDZV_ID="${RDZV_ID:-${SLURM_JOB_ID:-plan3d}}"\n'
        + tp_env
        + "\nEXTRA_ARGS=()\n"
        'if [[ -f "$HERE/megatron_args.sh" ]]; then\n'
        '  source "$HERE/megatron_args.sh"\n'
        '  EXTRA_ARGS+=("${MEGATRON_ARGS[@]}")\n'
        '  DEFAULT_SCRIPT="pretrain_gpt.py"\n'
        'elif [[ -f "$HERE/torchtitan.toml" ]]; then\n'
        '  EXTRA_ARGS+=(--job.config_file "$HERE/torchtitan.toml")\n'
        '  DEFAULT_SCRIPT="-m torchtitan.train"\n'
        "else\n"
        '  DEFAULT_SCRIPT="train.py"\n'
        "fi\n"
        "# TRAIN_SCRIPT: your entry point; TRAIN_ARGS: data, tokenizer, optimizer, checkpoints.\n"
        'read -r -a SCRIPT <<< "${TRAIN_SCRIPT:-$DEFAULT_SCRIPT}"\n'
        'read -r -a USER_ARGS <<< "${TRAIN_ARGS:-}"\n\n'
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" '
        '--node-rank "$NODE_RANK" \\\n'
        '  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" '
        "\\\n"
        '  "${SCRIPT[@]}" "${EXTRA_ARGS[@]}" "${USER_ARGS[@]}"\n')


def _sbatch(plan: Plan) -> str:
    cl = plan.cluster
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"plan3d-{plan.model.name}")
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name={name}\n"
        f"#SBATCH --nodes={cl.nodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={cl.gpus_per_node}\n"
        "#SBATCH --exclusive\n"
        + header(plan, SBATCH_TARGET)
        + "# Submit from the export directory: sbatch job.sbatch (set TRAIN_SCRIPT / TRAIN_ARGS "
        "in the environment).\n"
        "set -euo pipefail\n"
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"\n'
        "export MASTER_ADDR MASTER_PORT\n"
        "srun --kill-on-bad-exit=1 bash -c "
        "'NODE_RANK=\"$SLURM_NODEID\" exec bash \"$SLURM_SUBMIT_DIR/launch.sh\"'\n")


def render(plan: Plan) -> dict[str, str]:
    return {"launch.sh": _launch(plan), "job.sbatch": _sbatch(plan)}
