"""What ``resources.sbatch_extra`` may add to job.sbatch, and why some options are refused.

mxc writes the job's own directives (mxc/compiler/contract_build.py ``sbatch_directives``) and the
batch side of the node program relies on them: one task per node, one run directory, its own log
(``mxc run --output``), the variables ``mxc run`` exports, USR2 before the time limit, requeue for
restarts. An extra option that changes one of those does not tune the job, it breaks it, often
silently (sbatch takes the later directive): ``--array=0-9`` starts ten copies of one run that
write one run directory, ``--export=NONE`` drops MXC_BUNDLE_DIR, ``--no-requeue`` turns the restart
policy off, ``--wrap`` replaces the script. Those are errors, naming the spec field that does the
job where there is one; options with a side effect worth a second look (``--hold``,
``--get-user-env``, a GPU option beside ``resources.gpus_per_node``) are warnings (``mxc check``
rule ``sbatch-extra``). Anything else passes: sites need their own options (``--gpu-bind``,
``--network``, ``--comment``), which a later check compares with ``sbatch --help``.
"""

from __future__ import annotations

# Options of the spec's own fields: setting them again would silently replace the reviewed value.
FIELD_OPTIONS = {
    "job-name": "name", "nodes": "resources.nodes", "partition": "resources.partition",
    "account": "resources.account", "qos": "resources.qos", "constraint": "resources.constraint",
    "reservation": "resources.reservation", "time": "resources.time", "mem": "resources.mem",
    "cpus-per-task": "resources.cpus_per_task", "gpus-per-node": "resources.gpus_per_node",
    "exclusive": "resources.exclusive", "signal": "runtime.signal_seconds",
}
# Options that break how mxc runs the job, and why.
BREAKING = {
    "array": "an array job runs copies of this one run, all writing one run directory and one checkpoint directory",
    "wrap": "sbatch would run the wrapped command instead of the bundle's job.sbatch",
    "output": "mxc run names the job's log (<run>/train.log); another one hides it from mxc logs and triage",
    "error": "mxc run sends the job's stderr to <run>/train.log; another file hides it from mxc logs and triage",
    "open-mode": "mxc appends one train.log across restarts (--open-mode=append)",
    "export": "mxc run exports MXC_BUNDLE_DIR, MXC_RUN_DIR and the spec's Slurm variables; --export replaces them",
    "export-file": "mxc run exports the job's variables itself",
    "chdir": "the job's paths are mxc's (run directory, bundle); another working directory is the code's business "
             "(code.entry.workdir)",
    "ntasks": "mxc runs one task per node (resources.nodes)",
    "ntasks-per-node": "mxc runs one task per node",
    "ntasks-per-socket": "mxc runs one task per node",
    "ntasks-per-core": "mxc runs one task per node",
    "ntasks-per-gpu": "mxc runs one task per node",
    "no-requeue": "the restart policy (restart.*) requeues the job",
    "requeue": "mxc sets --requeue itself",
    "wait": "mxc run would wait for the job's end inside sbatch (use mxc run --wait)",
    "test-only": "sbatch would submit nothing",
    "parsable": "mxc run reads sbatch's own answer",
    "container": "Slurm's OCI container runs the script inside an image; mxc starts containers itself "
                 "(runtime.container)",
    "het-job": "a heterogeneous job is not one run of one bundle",
    "hetjob": "a heterogeneous job is not one run of one bundle",
    "uid": "the job runs as the user who submits it",
    "gid": "the job runs as the user who submits it",
}
# Worth a warning: the job runs, but not quite as the spec reads.
NOTED = {
    "hold": "the job waits, held, until someone releases it (scontrol release)",
    "get-user-env": "the job starts with the user's login environment, which the bundle does not show",
    "gres": "GPUs are resources.gpus_per_node (--gpus-per-node); a GPU gres beside it asks twice",
    "gpus": "GPUs are resources.gpus_per_node (--gpus-per-node)",
    "gpus-per-task": "GPUs are resources.gpus_per_node (--gpus-per-node)",
    "mem-per-cpu": "memory is resources.mem (--mem); Slurm refuses both",
    "mem-per-gpu": "memory is resources.mem (--mem); Slurm refuses both",
    "begin": "the job starts later than mxc run says",
}


def option_name(option: str) -> str:
    """``--array=0-9`` -> ``array``."""
    return option.removeprefix("--").partition("=")[0]


def problem(option: str) -> str | None:
    """Why ``option`` (an sbatch_extra entry) breaks the run, or None."""
    name = option_name(option)
    if name in FIELD_OPTIONS:
        return f"{option}: mxc sets --{name} from {FIELD_OPTIONS[name]}; set that instead"
    if name in BREAKING:
        return f"{option}: {BREAKING[name]}"
    return None


def noted(option: str) -> str | None:
    """Why ``option`` is worth a warning, or None."""
    return NOTED.get(option_name(option))
