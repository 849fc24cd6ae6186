"""``python -m example_shop demo``: the order/points demo (being built; see issue 5)."""

import sys


def main() -> int:
    print("example_shop: the demo is not built yet; nothing end to end exists to run.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
