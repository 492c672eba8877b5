"""The show suite's forward, in a fresh process (see :mod:`attnkit.bench.show`).

``python -m attnkit.bench._forward_child MODEL TEXT_FILE TOKENS`` prints
``{"forward_s": seconds}``: the plain sdpa forward of the model on the first
TOKENS tokens of the file, after a warm-up on a short input; with a fourth argument
``backward``, the causal LM's forward plus backward instead
(:func:`attnkit.bench.show_explain.forward_backward_seconds`), under the same key.
"""

from __future__ import annotations

import json
import sys

from .show import forward_seconds


def main(argv: list[str]) -> int:
    directory, text_file, tokens = argv[0], argv[1], int(argv[2])
    if argv[3:] == ["backward"]:
        from .show_explain import forward_backward_seconds

        print(json.dumps({"forward_s": forward_backward_seconds(directory, text_file, tokens)}))
        return 0
    print(json.dumps({"forward_s": forward_seconds(directory, text_file, tokens)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
