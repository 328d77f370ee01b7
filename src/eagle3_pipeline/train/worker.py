"""The torchrun worker: ``torchrun -m eagle3_pipeline.train.worker --params FILE --out F``.

The train stage starts it (:mod:`eagle3_pipeline.train.launch`) with its input view
(:class:`~eagle3_pipeline.train.view.TrainInputs`) written to the params file. Rank 0 writes
the run's record as it sees it (:class:`~eagle3_pipeline.train.record.TrainRecord`) to
``--out``; the stage reads it back, adds how torchrun ran and the NVML reading taken after
all workers exited, and writes the stage's details (``paths.details``/train.json).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from eagle3_pipeline.core.errors import ConfigError, StageError
from eagle3_pipeline.core.logs import setup_logging
from eagle3_pipeline.runtime.processes import die_with_parent
from eagle3_pipeline.train.plan import plan_training
from eagle3_pipeline.train.run import train
from eagle3_pipeline.train.view import TrainInputs


def main(argv: list[str] | None = None) -> None:
    """Train as one rank; a user error is one ``error: train:`` line and exit code 1."""
    parser = argparse.ArgumentParser(prog="eagle3_pipeline.train.worker")
    parser.add_argument("--params", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    die_with_parent()  # an agent killed with SIGKILL takes its workers with it
    setup_logging()
    cfg = TrainInputs.load(Path(args.params))
    from torch.distributed import DistError

    try:
        record = train(plan_training(cfg))  # this rank's plan, the stage's answer again
    except (ConfigError, StageError, FileNotFoundError) as exc:
        print(f"error: train: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except DistError as exc:  # a peer (another node's worker) is gone
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        rank = os.environ.get("RANK", "?")
        print(f"error: train: rank {rank} lost contact with another rank: {first}", file=sys.stderr)
        raise SystemExit(1) from None
    if record is not None:
        record.write(args.out)


if __name__ == "__main__":
    main()
