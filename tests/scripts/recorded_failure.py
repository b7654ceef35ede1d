"""A script whose main is wrapped by torch's `record`: its exception reaches the engine's error file."""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    raise ValueError("the learning rate is negative")


if __name__ == "__main__":
    main()
