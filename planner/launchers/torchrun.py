"""torchrun + Slurm: ``launch.sh`` (one torchrun per node) and ``job.sbatch`` (srun of it).

Targets torchrun from PyTorch 2.1+ (``--nnodes --nproc-per-node --node-rank --rdzv-backend c10d
--rdzv-endpoint --rdzv-id``) and Slurm 21.08+ (``--gpus-per-node``). With c10d rendezvous the
agents agree on node order themselves; every node still gets a contiguous block of
``nproc-per-node`` ranks, which is all the node-local TP layout needs.

The entry point is chosen by what was exported beside launch.sh: ``pretrain_gpt.py`` with
megatron_args.sh, ``-m torchtitan.train --job.config_file`` with torchtitan.toml (torchtitan
0.2.2), else ``train.py``; ``TRAIN_ARGS`` (data, tokenizer, checkpoints) follow. The framework's
arguments go only to the framework's own entry point: with ``TRAIN_SCRIPT`` set (your own
script) none are passed, and launch.sh refuses to start when both frameworks' files are beside
it (one exporter run refuses to write both, see :func:`conflicts`).

Before anything else launch.sh checks that it runs a whole, unchanged export set (issue #31):
``plan3d-manifest.json`` (written last by the export, its commit point: core/fileset.py) exists
and lists launch.sh, every file it lists has its SHA-256, and a framework file launch.sh would
read (megatron_args.sh, torchtitan.toml) is one it lists; otherwise one line on stderr and exit 1.
The check is a ``python3 -I`` script (isolated: no PYTHONPATH, no site packages): the standard
library reads the JSON and hashes on Linux and macOS alike, where ``sha256sum -c`` would need
coreutils and a second manifest format; python3 is there wherever torchrun is.
"""

from __future__ import annotations

from planner.core.fileset import MANIFEST
from planner.launchers.common import Facts, header, structure_problems
from planner.launchers.quoting import sh_token
from planner.predict.plan import Plan

TARGET = "torchrun (PyTorch 2.1+, checked with 2.13) with c10d rendezvous"
NAME = "torchrun"
SBATCH_TARGET = "Slurm 21.08+ sbatch (one task per node running launch.sh)"
DEFAULT_PORT = 29500

# launch.sh's check of its export set (module docstring); a FIFO or device is not read, it fails
_SET_CHECK = f"""\
import hashlib, json, os, stat, sys
here = sys.argv[1]
def data(name):
    fd = os.open(os.path.join(here, name), os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return f.read() if stat.S_ISREG(os.fstat(fd).st_mode) else None
try:
    files = json.loads(data("{MANIFEST}"))["files"]
    ok = isinstance(files, dict) and "launch.sh" in files and all(
        isinstance(n, str) and "/" not in n and n not in ("", ".", "..")
        and hashlib.sha256(data(n)).hexdigest() == h for n, h in files.items()) and all(
        n in files or not os.path.lexists(os.path.join(here, n))
        for n in ("megatron_args.sh", "torchtitan.toml"))
except Exception:
    ok = False
sys.exit(0 if ok else 1)
"""


def conflicts(targets: list[str]) -> str | None:
    """Why these targets cannot be exported together, if they cannot: launch.sh runs one
    framework's entry point."""
    if "torchrun" in targets and "megatron" in targets and "torchtitan" in targets:
        return ("launch.sh runs one framework's entry point; export it with megatron or with "
                "torchtitan, not both")
    return None


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
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        f"# Refuse an export set cut short or edited: every file {MANIFEST} lists has its "
        "SHA-256.\n"
        "command -v python3 >/dev/null || {\n"
        f'  echo "launch.sh: python3 is needed to check the export set ({MANIFEST})" >&2\n'
        "  exit 1\n"
        "}\n"
        "if ! python3 -I - \"$HERE\" <<'PLAN3D_SET_CHECK' 2>/dev/null\n"
        + _SET_CHECK
        + "PLAN3D_SET_CHECK\n"
        "then\n"
        '  echo "launch.sh: export set incomplete or modified: rerun plan solve --export ... '
        '--out $HERE --force" >&2\n'
        "  exit 1\n"
        "fi\n\n"
        f"NNODES={cl.nodes}\n"
        f"NPROC_PER_NODE={cl.gpus_per_node}  # world size {par.gpus} = "
        f"tp {par.tp} x pp {par.pp} x dp {par.dp}\n"
        'NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"\n'
        'MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"\n'
        'RDZV_ID="${RDZV_ID:-${SLURM_JOB_ID:-plan3d}}"\n'
        + tp_env
        + "\n# The framework's arguments go only to its own entry point (TRAIN_SCRIPT unset).\n"
        'FRAMEWORKS=()\n'
        '[[ -f "$HERE/megatron_args.sh" ]] && FRAMEWORKS+=(megatron_args.sh)\n'
        '[[ -f "$HERE/torchtitan.toml" ]] && FRAMEWORKS+=(torchtitan.toml)\n'
        'if (( ${#FRAMEWORKS[@]} > 1 )); then\n'
        '  echo "launch.sh: ${FRAMEWORKS[*]} are all here; keep one framework\'s file" >&2\n'
        "  exit 2\n"
        "fi\n"
        "FRAMEWORK_ARGS=()\n"
        'if [[ -n "${TRAIN_SCRIPT:-}" ]]; then\n'
        '  read -r -a SCRIPT <<< "$TRAIN_SCRIPT"  # your entry point: pass your own arguments\n'
        'elif [[ -f "$HERE/megatron_args.sh" ]]; then\n'
        '  source "$HERE/megatron_args.sh"\n'
        "  SCRIPT=(pretrain_gpt.py)\n"
        '  FRAMEWORK_ARGS=("${MEGATRON_ARGS[@]}")\n'
        'elif [[ -f "$HERE/torchtitan.toml" ]]; then\n'
        "  SCRIPT=(-m torchtitan.train)\n"
        '  FRAMEWORK_ARGS=(--job.config_file "$HERE/torchtitan.toml")\n'
        "else\n"
        "  SCRIPT=(train.py)\n"
        "fi\n"
        "# TRAIN_ARGS: data, tokenizer, optimizer, checkpoints.\n"
        'read -r -a USER_ARGS <<< "${TRAIN_ARGS:-}"\n\n'
        'exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" '
        '--node-rank "$NODE_RANK" \\\n'
        '  --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RDZV_ID" '
        "\\\n"
        '  "${SCRIPT[@]}" "${FRAMEWORK_ARGS[@]}" "${USER_ARGS[@]}"\n')


def _sbatch(plan: Plan) -> str:
    cl = plan.cluster
    name = sh_token(f"plan3d-{plan.model.name}")
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
