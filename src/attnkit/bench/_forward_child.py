"""The show suite's forward, in a fresh process (see :mod:`attnkit.bench.show`).

``python -m attnkit.bench._forward_child MODEL TEXT_FILE TOKENS`` prints
``{"forward_s": seconds}``: the plain sdpa forward of the model on the first
TOKENS tokens of the file, after a warm-up on a short input.
"""

from __future__ import annotations

import json
import sys

from .show import forward_seconds


def main(argv: list[str]) -> int:
    directory, text_file, tokens = argv[0], argv[1], int(argv[2])
    print(json.dumps({"forward_s": forward_seconds(directory, text_file, tokens)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
