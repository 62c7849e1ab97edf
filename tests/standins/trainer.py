"""A stand-in for MaxText's trainer (``python -m maxtext.trainers.pre_train.train ...``) in node-program tests.

What it does is chosen per attempt and rank by ``MXCTEST_TRAINER``: comma-separated
``ATTEMPT:RANK=BEHAVIOUR`` rules, ``*`` for any, the first match wins (default ``steps``):

* ``steps``: three completed-step lines (MaxText's format) and metrics lines, exit 0;
* ``silent``: prints nothing and waits for ever, as a rank hung in NCCL/RCCL initialisation does;
* ``nccl``: XLA's collective termination message (xla/service/rendezvous.cc) and its exit code 42;
* ``error``: one step, then a Python exception (an application error), exit 1;
* ``stall``: three steps, then waits for ever in ``stuck_in_collective`` (a hang after the first step; with
  ``steps=3`` a shut-down that does not end after the last step);
* ``exit1``: three steps, then exit 1 (with ``steps=3``, a failure after the last step, as JAX's teardown can);
* ``stop``: three steps, then stops itself (SIGSTOP) in ``stopped_in_collective``, as a rank someone
  stopped, or one the kernel froze, looks.

It records the start in ``$MXC_RUN_DIR/standin.attempt-A.rank-R`` (its pid), so tests can wait on it;
with ``MXCTEST_ENV_DUMP`` set, it also dumps its whole environment into ``$MXC_RUN_DIR/environment.attempt-A.rank-R.json``
(as a crash report or a debugging trainer would), so tests can check what training is given.
"""

import json
import os
import signal
import sys
import time


def behaviour() -> str:
    attempt, rank = os.environ.get("MXC_ATTEMPT", "0"), os.environ.get("MXC_RANK", "0")
    for rule in filter(None, os.environ.get("MXCTEST_TRAINER", "").split(",")):
        where, _, what = rule.partition("=")
        a, _, r = where.partition(":")
        r = r or "*"  # "ATTEMPT=..." means every rank
        if a in ("*", attempt) and r in ("*", rank):
            return what
    return "steps"


def metrics_file() -> str:
    return next(arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("metrics_file="))


def step(n: int) -> None:
    with open(metrics_file(), "a") as fh:
        fh.write(json.dumps({"step": float(n), "learning/loss": 5.0 - n / 10}) + "\n")
    print(f"completed step: {n}, seconds: 0.010, TFLOP/s/device: 0.010, Tokens/s/device: 1.000, total_weights: 64, "
          f"loss: {5.0 - n / 10:.3f}", flush=True)


def never_prints() -> None:
    while True:
        time.sleep(0.5)


def stuck_in_collective() -> None:
    while True:
        time.sleep(0.5)


def stopped_in_collective() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(0.5)


def main() -> int:
    run, attempt, rank = os.environ["MXC_RUN_DIR"], os.environ.get("MXC_ATTEMPT", "0"), os.environ.get("MXC_RANK", "0")
    with open(os.path.join(run, f"standin.attempt-{attempt}.rank-{rank}"), "w") as fh:
        fh.write(str(os.getpid()))
    if os.environ.get("MXCTEST_ENV_DUMP"):
        with open(os.path.join(run, f"environment.attempt-{attempt}.rank-{rank}.json"), "w") as fh:
            json.dump(dict(os.environ), fh, indent=1)
    what = behaviour()
    if what == "silent":
        never_prints()
    if what == "nccl":
        print("E1123 10:40:02.123456   4242 rendezvous.cc:49] Termination timeout for `acquire clique for rank 3 of 16` "
              "of 600 seconds exceeded. Exiting to ensure a consistent program state. Expected 8 threads to join the "
              "rendezvous, but only 7 of them arrived on time.", file=sys.stderr, flush=True)
        return 42
    if what == "error":
        step(0)
        raise ValueError("the data pipeline ran out of shards")
    for n in range(3):
        step(n)
    if what == "stall":
        stuck_in_collective()
    if what == "exit1":
        print("stand-in: exit 1 after the last step", file=sys.stderr, flush=True)
        return 1
    if what == "stop":
        stopped_in_collective()
    return 0


if __name__ == "__main__":
    sys.exit(main())
